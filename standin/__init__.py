"""The stand-in inference server: dualpods' simulation runtime, with vLLM's HTTP surface and no model.

It ships with the product so that a launcher can simulate model servers (`--stand-in`): for trying
the controllers and the chart on a cluster without GPUs, for scale tests, and for tests that need many
model servers or exact control over start-up, sleep, wake and request timing. It serves vLLM's surface
(`api.vllm_surface`: `/health`, `/v1/models`, `/v1/completions` and `/v1/chat/completions` in JSON or SSE
with canned text, `/sleep`, `/wake_up`, `/is_sleeping`, `/metrics`; no LoRA adapters) over its own engine
(`standin.engine`), behaving as vLLM does — including holding requests while asleep. It takes vLLM's serve
flags, so a launcher can fork `main(argv)` where it would run vLLM, or run `python -m standin --port N ...`.
"""

from standin.cli import build_parser, main

__all__ = ["build_parser", "main"]
