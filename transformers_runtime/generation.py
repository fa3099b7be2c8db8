"""Decoding one prompt into `n` sequences, token by token over a KV cache, on the model thread.

Text leaves as deltas the moment it is final: a stop sequence could still be forming at the end of
the text (so the last `len(stop) - 1` characters wait), and a byte-level tokenizer may be in the
middle of a UTF-8 character (a trailing U+FFFD waits). The concatenated deltas of a sequence are
therefore exactly its final text, streamed or not.
"""

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from .text import TextCodec

FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Delta:
    """New text of sequence `index`; the last delta of a sequence says why it ended."""

    index: int
    text: str
    finish_reason: FinishReason | None = None
    stop_reason: str | None = None  # the stop sequence that matched
    tokens: int = 0  # on the last delta: the tokens the sequence generated (EOS included, as vLLM counts)
    token_ids: tuple[int, ...] = ()  # on the last delta: those tokens


Emit = Callable[[Delta], None]


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of `logits`: the argmax when greedy, else temperature and nucleus (top-p) sampling."""
    if generator is None:
        return logits.argmax(dim=-1)
    probs = torch.softmax(logits.float() / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p; the most likely token always stays.
        outside = sorted_probs.cumsum(dim=-1) - sorted_probs > params.top_p
        sorted_probs[outside] = 0.0
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)


def _first_stop(text: str, stops: tuple[str, ...], start: int) -> tuple[int, str] | None:
    """The earliest stop sequence in `text` at or after `start` (nothing before it was sent or can match)."""
    found = [(position, stop) for stop in stops if (position := text.find(stop, start)) >= 0]
    return min(found) if found else None


class _Sequence:
    def __init__(self, index: int, params: SamplingParams, max_tokens: int, codec: TextCodec, emit: Emit) -> None:
        self.index = index
        self.token_ids: list[int] = []
        self.text = ""
        self.sent = 0  # characters of `text` already emitted
        self.finished = False
        self._stops = params.stop
        self._holdback = max((len(stop) for stop in params.stop), default=1) - 1
        self._max_tokens = max_tokens
        self._codec = codec
        self._emit = emit

    def push(self, token: int) -> None:
        self.token_ids.append(token)
        if token in self._codec.eos_ids:
            self.finish("stop")
            return
        text = self._codec.decode(self.token_ids)
        hit = _first_stop(text, self._stops, self.sent)
        if hit is not None:
            position, stop = hit
            self.text = text[:position]
            self.finish("stop", stop)
            return
        self.text = text
        if len(self.token_ids) >= self._max_tokens:
            self.finish("length")
            return
        settled = min(len(text.rstrip("\ufffd")), len(text) - self._holdback)
        if settled > self.sent:
            self._emit(Delta(self.index, text[self.sent : settled]))
            self.sent = settled

    def finish(self, reason: FinishReason, stop: str | None = None) -> None:
        self.finished = True
        self._emit(Delta(self.index, self.text[self.sent :], reason, stop, len(self.token_ids), tuple(self.token_ids)))
        self.sent = len(self.text)


def _forward_options(model: Any) -> dict[str, Any]:
    """Ask for the last position's logits only, where the model supports it (saves a vocab-sized matmul per row)."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def generate(
    model: Any,
    codec: TextCodec,
    prompt_ids: list[int],
    max_tokens: int,
    params: SamplingParams,
    emit: Emit,
    aborted: Callable[[], bool],
    index_base: int = 0,
) -> None:
    """Decode `params.n` sequences from one prompt, calling `emit` with each delta (indices from `index_base`).

    The `n` sequences share the prompt, so they run as one batch without padding. `aborted` is polled
    once per token; when it turns true, unfinished sequences end with finish_reason "abort".
    """
    device = model.device
    generator = None
    if not params.greedy:
        generator = torch.Generator(device=device)
        if params.seed is None:
            generator.seed()
        else:
            generator.manual_seed(params.seed)
    sequences = [_Sequence(index_base + i, params, max_tokens, codec, emit) for i in range(params.n)]
    options = _forward_options(model)
    step_input = torch.tensor([prompt_ids] * params.n, dtype=torch.long, device=device)
    cache = None
    with torch.inference_mode():
        while not aborted():
            output = model(input_ids=step_input, past_key_values=cache, use_cache=True, **options)
            cache = output.past_key_values
            tokens = sample(output.logits[:, -1, :], params, generator)
            for sequence, token in zip(sequences, tokens.tolist(), strict=True):
                if not sequence.finished:
                    sequence.push(token)
            if all(sequence.finished for sequence in sequences):
                return
            step_input = tokens.unsqueeze(-1)
    for sequence in sequences:
        if not sequence.finished:
            sequence.finish("abort")
