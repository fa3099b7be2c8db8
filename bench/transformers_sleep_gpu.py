"""Level-1 sleep/wake of the transformers runtime on a CUDA GPU: memory freed, outputs kept, wake speed.

Builds a random-weight Llama of a few GiB in memory (nothing read from disk), records a forward
pass's logits and a greedy continuation, then, for each round, sleeps it at level 1 with the
server's own `SleepManager` and wakes it again. Checks:
  - after sleep, `torch.cuda.memory_allocated()` is near zero (the weights are in pinned host memory);
  - after wake, logits and greedy tokens are bit-for-bit those from before the first sleep;
  - wake throughput (packed bytes / wake time) is at least 0.8 x that of a plain pinned
    host-to-device copy of the same number of bytes.

Usage: .venv/bin/python bench/transformers_sleep_gpu.py [--layers 8] [--dtype float16] [--rounds 3]
Exit status: 0 when every check passes, or when there is no CUDA device (nothing to measure); 1 otherwise.
"""

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from transformers_runtime.model import DTYPES, ModelHolder
from transformers_runtime.sleep import SleepManager, model_tensors

GIB = 1024**3
TARGET_RATIO = 0.8
ASLEEP_LIMIT_BYTES = 64 * 1024**2  # what may stay allocated while asleep (no weights, no KV cache)
PROMPT_TOKENS = 32
NEW_TOKENS = 16


def random_llama(layers: int, dtype: torch.dtype, device: torch.device, seed: int) -> Callable[[], torch.nn.Module]:
    """A loader for a Llama-7B-shaped model cut to `layers` layers; the same weights on every call."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32000,
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=layers,
        num_attention_heads=32,
        num_key_value_heads=8,
        max_position_embeddings=2048,
        tie_word_embeddings=False,
        pad_token_id=0,
    )

    def load() -> torch.nn.Module:
        torch.manual_seed(seed)
        with torch.device(device):
            model: torch.nn.Module = LlamaForCausalLM._from_config(config, dtype=dtype).eval()
        return model

    return load


def outputs(model: Any, prompt: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The last position's logits and a greedy continuation, on the host."""
    with torch.inference_mode():
        logits = model(prompt).logits[:, -1].float().cpu()
        tokens = model.generate(prompt, max_new_tokens=NEW_TOKENS, do_sample=False).cpu()
    return logits, tokens


def plain_copy_seconds(nbytes: int, device: torch.device, repeats: int) -> float:
    """The best time of a plain pinned host-to-device copy of `nbytes` (one warm-up first)."""
    source = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    target = torch.empty(nbytes, dtype=torch.uint8, device=device)
    times = []
    for _ in range(repeats + 1):
        torch.cuda.synchronize(device)
        started = time.perf_counter()
        target.copy_(source, non_blocking=True)
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - started)
    return min(times[1:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=8, help="decoder layers (8: about 3.4 GB in float16)")
    parser.add_argument("--dtype", choices=("float16", "bfloat16"), default="float16")
    parser.add_argument("--rounds", type=int, default=3, help="sleep/wake cycles")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure (this benchmark needs an NVIDIA GPU)")
        return 0
    from transformers.utils import logging as transformers_logging

    transformers_logging.set_verbosity_error()
    device = torch.device("cuda", torch.cuda.current_device())
    print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}")

    holder = ModelHolder(random_llama(args.layers, DTYPES[args.dtype], device, args.seed))
    holder.load()
    model = holder.module
    weight_bytes = sum(t.numel() * t.element_size() for t in model_tensors(model))
    print(
        f"model: {args.layers} layers, {weight_bytes / GIB:.2f} GiB of {args.dtype} weights, built in "
        f"{holder.load_seconds:.1f} s"
    )
    prompt = torch.randint(1, 32000, (1, PROMPT_TOKENS), generator=torch.Generator().manual_seed(1)).to(device)
    logits, tokens = outputs(model, prompt)
    torch.cuda.synchronize(device)
    awake_bytes = torch.cuda.memory_allocated(device)

    manager = SleepManager(holder)
    failures: list[str] = []
    rounds: list[dict[str, float]] = []
    packed = 0
    for round_ in range(args.rounds):
        started = time.perf_counter()
        manager.sleep(1)
        sleep_s = time.perf_counter() - started
        asleep_bytes = torch.cuda.memory_allocated(device)
        reserved_bytes = torch.cuda.memory_reserved(device)
        started = time.perf_counter()
        awake = manager.wake()
        wake_s = time.perf_counter() - started
        retired = manager.take_retired()
        if not awake or retired is None:
            raise RuntimeError("a level-1 wake must wake fully and leave its host copy to release")
        packed = retired.nbytes
        started = time.perf_counter()
        retired.release()
        release_s = time.perf_counter() - started
        after_logits, after_tokens = outputs(model, prompt)
        identical = torch.equal(after_logits, logits) and torch.equal(after_tokens, tokens)
        rounds.append(
            {"sleep_s": sleep_s, "wake_s": wake_s, "release_s": release_s, "wake_gbps": packed / wake_s / 1e9}
        )
        print(
            f"round {round_ + 1}: sleep {sleep_s:.3f} s; asleep {asleep_bytes / 2**20:.1f} MiB allocated "
            f"({reserved_bytes / 2**20:.1f} MiB reserved, {awake_bytes / GIB:.2f} GiB before); wake {wake_s:.3f} s "
            f"= {packed / wake_s / 1e9:.1f} GB/s; host copy released in {release_s:.3f} s; "
            f"outputs {'identical' if identical else 'DIFFERENT'}"
        )
        if asleep_bytes > ASLEEP_LIMIT_BYTES:
            failures.append(f"round {round_ + 1}: {asleep_bytes / 2**20:.1f} MiB still allocated while asleep")
        if not identical:
            failures.append(
                f"round {round_ + 1}: outputs after wake differ (max |dlogit| "
                f"{(after_logits - logits).abs().max().item():.3g})"
            )

    plain_s = plain_copy_seconds(packed, device, repeats=args.rounds)
    plain_gbps = packed / plain_s / 1e9
    wake_gbps = statistics.median(r["wake_gbps"] for r in rounds)
    ratio = wake_gbps / plain_gbps
    print(f"plain pinned host->device copy of {packed / GIB:.2f} GiB: {plain_s:.3f} s = {plain_gbps:.1f} GB/s")
    print(f"wake / plain copy: {ratio:.2f} (target >= {TARGET_RATIO})")
    if ratio < TARGET_RATIO:
        failures.append(f"wake reaches {ratio:.2f} of a plain copy's throughput, below {TARGET_RATIO}")
    summary = {
        "device": torch.cuda.get_device_name(device),
        "weights_gib": round(weight_bytes / GIB, 3),
        "dtype": args.dtype,
        "median_wake_gbps": round(wake_gbps, 2),
        "plain_copy_gbps": round(plain_gbps, 2),
        "ratio": round(ratio, 3),
        "rounds": [{k: round(v, 4) for k, v in r.items()} for r in rounds],
        "checks": failures if failures else "PASS",
    }
    print(json.dumps(summary))
    for failure in failures:
        print(f"FAIL: {failure}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
