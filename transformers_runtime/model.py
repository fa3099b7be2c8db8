"""Where the weights come from (a local checkpoint, resolved once) and the holder the server generates with.

A level-2 sleep drops the model and a wake loads it again, so loading is a function the holder keeps
(`ModelHolder(load)`), called at start and on every such wake; the dtype and device are resolved
once, so a reload gives exactly the weights the server started with.
"""

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("transformers_runtime")

# vLLM's --dtype spellings.
DTYPES = {
    "float32": torch.float32,
    "float": torch.float32,
    "float16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
}
DTYPE_CHOICES = ("auto", *DTYPES)
DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(choice: str) -> torch.device:
    if choice == "auto":
        choice = "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda was asked for, but torch sees no CUDA device")
    return torch.device(choice)


def resolve_dtype(choice: str, device: torch.device, checkpoint_dtype: object) -> torch.dtype:
    """vLLM's `auto` on a GPU: the checkpoint's dtype, with float32 checkpoints downcast to bfloat16.

    On a CPU `auto` means float32: half-precision matmuls are slow or missing on most CPUs.
    """
    if choice != "auto":
        return DTYPES[choice]
    if device.type == "cpu":
        return torch.float32
    dtype = checkpoint_dtype if isinstance(checkpoint_dtype, torch.dtype) else DTYPES.get(str(checkpoint_dtype))
    if dtype is None or dtype == torch.float32:
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return dtype


@dataclass(frozen=True)
class Checkpoint:
    """A local model directory, how to load it, and what its config says about it."""

    path: Path
    dtype: torch.dtype
    device: torch.device
    max_model_len: int
    generation_defaults: dict[str, Any]  # the model's generation_config.json, e.g. temperature
    eos_ids: frozenset[int]
    trust_remote_code: bool = False

    @classmethod
    def inspect(
        cls, path: Path, dtype: str, device: str, max_model_len: int | None, trust_remote_code: bool = False
    ) -> "Checkpoint":
        """Read the config (offline) and resolve `auto` choices; raise ValueError when they cannot work."""
        from transformers import AutoConfig, GenerationConfig

        config = AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
        resolved_device = resolve_device(device)
        limit = getattr(config.get_text_config(), "max_position_embeddings", None)
        if max_model_len is None:
            if limit is None:
                raise ValueError("the model's config has no max_position_embeddings; pass --max-model-len")
            max_model_len = int(limit)
        elif limit is not None and max_model_len > limit:
            raise ValueError(f"--max-model-len {max_model_len} exceeds the model's maximum context of {limit}")
        try:
            generation = GenerationConfig.from_pretrained(path, local_files_only=True).to_diff_dict()
        except OSError:  # no generation_config.json
            generation = {}
        eos = generation.get("eos_token_id", getattr(config, "eos_token_id", None))
        eos_ids = frozenset(eos if isinstance(eos, list) else [] if eos is None else [eos])
        return cls(
            path=path,
            dtype=resolve_dtype(dtype, resolved_device, getattr(config, "dtype", None)),
            device=resolved_device,
            max_model_len=max_model_len,
            generation_defaults=generation,
            eos_ids=eos_ids,
            trust_remote_code=trust_remote_code,
        )

    def load_model(self) -> torch.nn.Module:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(
            self.path,
            local_files_only=True,
            dtype=self.dtype,
            device_map=str(self.device),
            trust_remote_code=self.trust_remote_code,
        )
        module: torch.nn.Module = model.eval()
        return module


class ModelHolder:
    """The model the server generates with, or nothing while a level-2 sleep has dropped it."""

    def __init__(self, load: Callable[[], torch.nn.Module]) -> None:
        self._load = load
        self._module: torch.nn.Module | None = None
        self.load_seconds = 0.0

    @property
    def loaded(self) -> bool:
        return self._module is not None

    @property
    def module(self) -> Any:  # the model's own type: transformers is untyped here
        if self._module is None:
            raise RuntimeError("the model is not loaded (dropped by a level-2 sleep)")
        return self._module

    def load(self) -> None:
        started = time.perf_counter()
        self._module = self._load()
        self.load_seconds = time.perf_counter() - started
        log.info("model loaded in %.2f s", self.load_seconds)

    def drop(self) -> None:
        """Forget the model; the caller has already freed its tensors (see `sleep.release_tensors`)."""
        self._module = None
        gc.collect()  # peft and transformers leave reference cycles; collect them now, not at some later GC
