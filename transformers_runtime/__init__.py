"""The transformers runtime: an OpenAI-compatible model server on Hugging Face transformers and torch.

It is the fallback to vLLM (SPEC E4/E5) with vLLM's HTTP surface (`api.vllm_surface`: OpenAI routes,
`/health`, Prometheus `/metrics`, the dev sleep/wake endpoints and runtime LoRA endpoints) over its own
engine (`app.ServerState`), so the launcher, controller and clients treat both runtimes alike. See
docs/api.md, "Transformers runtime".
"""

from .cli import build_parser, main

__all__ = ["build_parser", "main"]
