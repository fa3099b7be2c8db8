"""A stand-in inference server: a test double with vLLM's HTTP surface, not an inference engine.

Tests that need many model servers, or exact control over start-up, sleep, wake and request
timing, run this instead of vLLM: `/health`, `/v1/models`, `/v1/completions` and
`/v1/chat/completions` (JSON or SSE, canned text), `/sleep`, `/wake_up`, `/is_sleeping` and
`/metrics`, behaving as vLLM does — including holding requests while asleep. It takes vLLM's
serve flags, so a launcher can fork `main(argv)` where it would run vLLM, or run
`python -m tests.standin --port N ...`.
"""

from tests.standin.cli import build_parser, main

__all__ = ["build_parser", "main"]
