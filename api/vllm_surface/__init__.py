"""vLLM's HTTP surface, written once for every runtime that imitates it (the stand-in, the transformers runtime).

A runtime supplies only its engine, behind the protocols of `api.vllm_surface.engine`; this package holds
what a client sees the same from both: the route table and its request checks (`app`), the OpenAI-shaped
errors and server-sent events, the bodies of the non-OpenAI routes (`bodies`), vLLM's queue and sleep
gauges (`gauges`), and vLLM's serve flags and serving loop (`cli`). A launcher forks either runtime where
it would run vLLM, so both must answer, log and take flags as vLLM does.
"""
