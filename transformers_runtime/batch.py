"""Continuous batching on the model thread: every running sequence advances by one token per step.

A batch holds the sequences of several requests in one KV cache (transformers' `DynamicCache`). A
request joins between two steps: its prompt is prefilled alone (no padding, so its first token is
exactly what it would be alone), then its cache rows are left-padded to the batch's length and
appended; the attention mask hides the padding and each row gets its own position ids, so a row
decodes as it would alone. A finished sequence leaves at once, and padding no row needs any more is
cut off, so a long request never makes the others pay for its length.

transformers' own continuous-batching manager (`generate_batch`, `init_continuous_batching`) is not
used: it runs its own generation thread over a paged cache, which cannot share the model thread
with sleep/wake (weights moved off the device between two steps) and LoRA activation; and it has no
per-request seeds or OpenAI penalties. `generate` itself has no way to add a sequence mid-flight.

Joining needs a cache whose layers are plain `DynamicLayer`s (full attention). A model with another
cache (sliding windows, linear attention) still batches a request's `n` sequences, but a prompt is
prefilled only once the batch has drained.

All requests of one batch use one LoRA adapter (or none): the adapter is a property of the model
while it runs, not of a row. The engine batches by adapter (see engine.py).
"""

import inspect
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import groupby
from typing import Any, Protocol

import torch
from torch.nn import functional
from transformers.cache_utils import DynamicCache, DynamicLayer

from .generation import Delta, TextSequence, TokenLogprob
from .sampling import SamplingParams, sample
from .text import TextCodec


@dataclass(frozen=True)
class Prompt:
    token_ids: list[int]
    max_tokens: int


class Request(Protocol):
    """What the batch needs of a request: its prompts and parameters, where its deltas go, whether it was aborted."""

    @property
    def prompts(self) -> list[Prompt]: ...

    @property
    def params(self) -> SamplingParams: ...

    @property
    def aborted(self) -> bool: ...

    def post(self, delta: Delta) -> None: ...


@dataclass(eq=False)
class _Member:
    request: Request
    generator: torch.Generator | None
    sequences: list[TextSequence] = field(default_factory=list)
    unstarted: int = 0  # prompts not prefilled yet

    @property
    def done(self) -> bool:
        return self.unstarted == 0 and all(s.finished for s in self.sequences)


@dataclass(eq=False)
class _Row:
    """One sequence in the cache: `length` real tokens there, `next_token` chosen but not yet fed."""

    member: _Member
    prompt: list[int]
    text: TextSequence
    length: int
    next_token: int = -1


def _new_generator(params: SamplingParams, device: torch.device) -> torch.Generator | None:
    if params.greedy:
        return None
    generator = torch.Generator(device=device)
    if params.seed is None:
        generator.seed()
    else:
        generator.manual_seed(params.seed)
    return generator


def _forward_options(model: Any) -> dict[str, Any]:
    """Ask for the last position's logits only, where the model supports it (saves a vocab-sized matmul per row)."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def _logprobs(logits: torch.Tensor, chosen: torch.Tensor, top: int | None) -> list[TokenLogprob | None]:
    """Per row: the chosen token's log-probability under the model (before any sampling parameter, as
    vLLM's default), and the `top` most likely; Nones when not asked for."""
    if top is None:
        return [None] * len(chosen)
    logprobs = torch.log_softmax(logits.float(), dim=-1)
    picked = logprobs.gather(-1, chosen.unsqueeze(-1)).squeeze(-1).tolist()
    best = logprobs.topk(top, dim=-1) if top else None
    rows: list[TokenLogprob | None] = []
    for row, (token, logprob) in enumerate(zip(chosen.tolist(), picked, strict=True)):
        pairs = () if best is None else tuple(zip(best.indices[row].tolist(), best.values[row].tolist(), strict=True))
        rows.append(TokenLogprob(token, logprob, pairs))
    return rows


def _pad_left(tensor: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    """`tensor` with zeros before it along `dim` (counted from the end) up to `width`."""
    missing = width - tensor.shape[dim]
    if missing == 0:
        return tensor
    padding = [0, 0] * (-dim - 1) + [missing, 0]
    return functional.pad(tensor, padding)


class Batch:
    """The sequences running together on the model thread; only that thread calls `step`. How many may
    join is the engine's decision (`--max-num-seqs`, by `rows`)."""

    def __init__(self, model: Any, codec: TextCodec) -> None:
        self._model = model
        self._codec = codec
        self._options = _forward_options(model)
        self._members: list[_Member] = []
        self._unstarted: deque[tuple[_Member, int, Prompt]] = deque()  # (member, prompt number, prompt)
        self._rows: list[_Row] = []
        self._cache: DynamicCache | None = None
        self._mask = torch.zeros(0, 0, dtype=torch.long, device=model.device)  # 1 where the cache holds a token
        self.joinable = True  # False once a cache turned out not to be made of plain layers

    @property
    def rows(self) -> int:
        """Sequences running or about to start: what a newcomer's `n` x prompts must fit next to."""
        return len(self._rows) + sum(m.request.params.n for m, _, _ in self._unstarted)

    def step(self, joining: Sequence[Request]) -> list[Request]:
        """Take in `joining`, advance every running sequence by one token, start what fits; return the finished."""
        for request in joining:
            member = _Member(
                request, _new_generator(request.params, self._model.device), unstarted=len(request.prompts)
            )
            self._members.append(member)
            self._unstarted.extend((member, number, prompt) for number, prompt in enumerate(request.prompts))
        with torch.inference_mode():
            self._end_aborted()
            self._drop_finished()
            if self._rows:
                self._decode()
            while self._unstarted and (not self._rows or self.joinable):
                self._prefill(*self._unstarted.popleft())
            self._drop_finished()
        finished = [member for member in self._members if member.done]
        self._members = [member for member in self._members if not member.done]
        return [member.request for member in finished]

    def _end_aborted(self) -> None:
        for row in self._rows:
            if row.member.request.aborted and not row.text.finished:
                row.text.finish("abort")

    def _decode(self) -> None:
        device = self._model.device
        mask = torch.cat([self._mask, torch.ones(len(self._rows), 1, dtype=torch.long, device=device)], dim=1)
        output = self._model(
            input_ids=torch.tensor([[row.next_token] for row in self._rows], device=device),
            attention_mask=mask,
            position_ids=torch.tensor([[row.length] for row in self._rows], device=device),
            past_key_values=self._cache,
            use_cache=True,
            **self._options,
        )
        self._cache, self._mask = output.past_key_values, mask
        for row in self._rows:
            row.length += 1
        self._choose(output.logits[:, -1, :], self._rows)

    def _prefill(self, member: _Member, number: int, prompt: Prompt) -> None:
        params = member.request.params
        sequences = [
            TextSequence(number * params.n + i, params, prompt.max_tokens, self._codec, member.request.post)
            for i in range(params.n)
        ]
        member.sequences += sequences
        member.unstarted -= 1
        if member.request.aborted:
            for sequence in sequences:
                sequence.finish("abort")
            return
        ids = torch.tensor([prompt.token_ids], device=self._model.device)
        output = self._model(input_ids=ids, use_cache=True, **self._options)
        cache = output.past_key_values
        if params.n > 1:  # the n sequences share the prompt: prefilled once, its cache row copied
            cache.batch_repeat_interleave(params.n)
        rows = [_Row(member, prompt.token_ids, sequence, len(prompt.token_ids)) for sequence in sequences]
        self._choose(output.logits[:, -1, :].expand(params.n, -1), rows)
        self._join(cache, rows)

    def _choose(self, logits: torch.Tensor, rows: list[_Row]) -> None:
        """Sample each request's rows with its own parameters and generator, and push the tokens.

        The argmax of every row is taken at once: most requests are plain greedy ones and need nothing else.
        """
        argmax = logits.argmax(dim=-1)
        start = 0
        for member, group in groupby(rows, key=lambda row: row.member):
            members_rows = list(group)
            end = start + len(members_rows)
            params = member.request.params
            if params.greedy and not params.penalised and not params.logit_bias:
                chosen = argmax[start:end]
            else:
                chosen = sample(
                    logits[start:end],
                    params,
                    member.generator,
                    [row.prompt for row in members_rows],
                    [row.text.token_ids for row in members_rows],
                )
            logprobs = _logprobs(logits[start:end], chosen, params.logprobs)
            for row, token, logprob in zip(members_rows, chosen.tolist(), logprobs, strict=True):
                if not row.text.finished:
                    row.next_token = token
                    row.text.push(token, logprob)
            start = end

    def _join(self, cache: DynamicCache, rows: list[_Row]) -> None:
        new_mask = torch.ones(len(rows), rows[0].length, dtype=torch.long, device=self._model.device)
        if not all(type(layer) is DynamicLayer for layer in cache.layers):
            self.joinable = False
        if self._cache is None or not self._rows:
            self._cache, self._mask, self._rows = cache, new_mask, rows
            return
        width = max(self._mask.shape[1], new_mask.shape[1])
        for ours, theirs in zip(self._cache.layers, cache.layers, strict=True):
            ours.keys = torch.cat([_pad_left(ours.keys, width, -2), _pad_left(theirs.keys, width, -2)])
            ours.values = torch.cat([_pad_left(ours.values, width, -2), _pad_left(theirs.values, width, -2)])
        self._mask = torch.cat([_pad_left(self._mask, width, -1), _pad_left(new_mask, width, -1)])
        self._rows += rows

    def _drop_finished(self) -> None:
        """Forget finished rows, and the left padding that only they needed."""
        keep = [i for i, row in enumerate(self._rows) if not row.text.finished]
        if len(keep) == len(self._rows):
            return
        self._rows = [self._rows[i] for i in keep]
        if not self._rows:
            self._cache = None
            self._mask = self._mask[:0, :0]
            return
        assert self._cache is not None
        index = torch.tensor(keep, device=self._mask.device)
        if not self.joinable:  # a cache of other layers: theirs to select from, no padding to cut
            self._cache.batch_select_indices(index)
            self._mask = self._mask[index]
            return
        unused = self._mask.shape[1] - max(row.length for row in self._rows)
        for layer in self._cache.layers:
            layer.keys = layer.keys[index, :, unused:, :]
            layer.values = layer.values[index, :, unused:, :]
        self._mask = self._mask[index, unused:]
