"""The requester: the small process in every server-requesting Pod (FMA 0.6's `cmd/requester`).

It holds the Pod's GPUs in the scheduler's books, reports their UUIDs and memory use to the
dual-pods controller over the SPI, serves the `/ready` probe whose value the controller sets, and
proxies the OpenAI API to the model server it is bound to, guarding it (E7, FMA 0.7's plan).
Run it with `python -m requester`; `docs/api.md` lists its routes, flags and environment.
"""
