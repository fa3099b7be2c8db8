"""Write a tiny PEFT LoRA adapter (q_proj/v_proj) for a model built by `e2e.tiny_model`.

LoRA tests (vLLM's `/v1/load_lora_adapter`, the transformers runtime via peft) need an adapter that
loads and visibly changes the output, and none can be downloaded. Following `vllm-cpu.md` §2, the
adapter is written directly — `adapter_model.safetensors` plus `adapter_config.json` — with random
A and clearly nonzero B matrices, so applying it moves the logits.

    python -m e2e.tiny_lora OUT_DIR --base MODEL_DIR [--seed N] [--rank 8]
"""

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import save_file

from e2e import tiny_model
from scripts.build_cache import ensure_built, readable_by_all, report_build

# Bump when anything below changes what is written: it keys the cache.
RECIPE = "tiny-lora-v1"

TARGET_MODULES = ("q_proj", "v_proj")
# B is usually zero-initialised (a no-op adapter); large enough here to dominate the tiny base's
# attention projections (init std 0.02), so the adapter's effect is unmistakable.
B_STD = 0.2


def _projection_shapes(config: dict[str, Any]) -> dict[str, tuple[int, int]]:
    """(out_features, in_features) of each target projection, from the base model's config."""
    hidden = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or hidden // config["num_attention_heads"])
    return {
        "q_proj": (config["num_attention_heads"] * head_dim, hidden),
        "v_proj": (config["num_key_value_heads"] * head_dim, hidden),
    }


def build_tiny_lora(out_dir: Path, base: Path, seed: int = 0, rank: int = 8) -> None:
    """Write a rank-`rank` adapter for the model in `base` into `out_dir`, seeded by `seed`."""
    config = json.loads((base / "config.json").read_text())
    shapes = _projection_shapes(config)
    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(config["num_hidden_layers"]):
        for module in TARGET_MODULES:
            out_features, in_features = shapes[module]
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            a = rng.normal(0.0, in_features**-0.5, (rank, in_features))
            b = rng.normal(0.0, B_STD, (out_features, rank))
            tensors[f"{prefix}.lora_A.weight"] = a.astype(np.float32)
            tensors[f"{prefix}.lora_B.weight"] = b.astype(np.float32)
    adapter_config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base),
        "r": rank,
        "lora_alpha": 2 * rank,
        "lora_dropout": 0.0,
        "target_modules": list(TARGET_MODULES),
        "bias": "none",
        "fan_in_fan_out": False,
        "inference_mode": True,
        "init_lora_weights": True,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    (out_dir / "adapter_config.json").write_text(json.dumps(adapter_config, indent=2) + "\n")


def ensure_tiny_lora(base_seed: int = 0, seed: int = 0, rank: int = 8) -> Path:
    """The adapter for the cached tiny model `base_seed`, from the cache (`loras/`), built on first use."""
    base = tiny_model.ensure_tiny_model(base_seed)
    key = f"{RECIPE}-r{rank}-seed{seed}-for-{base.name}"
    return ensure_built("loras", key, lambda out: build_tiny_lora(out, base, seed, rank))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.tiny_lora", description="Write a tiny LoRA adapter for a tiny model."
    )
    parser.add_argument("out_dir", type=Path, help="directory to write the adapter into")
    parser.add_argument("--base", type=Path, required=True, help="the model directory it adapts")
    parser.add_argument("--seed", type=int, default=0, help="weight seed")
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank r (vLLM: --max-lora-rank >= r)")
    args = parser.parse_args(argv)
    with report_build(f"{RECIPE} rank {args.rank} seed {args.seed} for {args.base}", args.out_dir):
        build_tiny_lora(args.out_dir, args.base, args.seed, args.rank)
        readable_by_all(args.out_dir)


if __name__ == "__main__":
    main()
