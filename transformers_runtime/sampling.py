"""Choosing the next token of a request's sequences from their logits, with vLLM's sampling parameters.

The order is vLLM's: logit bias, then the penalties (repetition over prompt and output, presence
and frequency over the output), then either the argmax (greedy) or temperature, top-k, top-p and
min-p before drawing from what is left. Each request draws from its own generator, so a seeded
request gives the same tokens whichever other requests share its batch.
"""

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # 0 means greedy
    top_p: float = 1.0
    top_k: int = 0  # 0: every token
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    include_stop: bool = False  # the matched stop string stays in the text
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] = field(default_factory=dict)
    logprobs: int | None = None  # None: none; k: each token's, and the k most likely at its place

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalised(self) -> bool:
        return bool(self.presence_penalty or self.frequency_penalty or self.repetition_penalty != 1.0)


def _apply_penalties(
    logits: torch.Tensor, params: SamplingParams, prompts: Sequence[Sequence[int]], outputs: Sequence[Sequence[int]]
) -> torch.Tensor:
    """vLLM's penalties, row by row: repetition on every token seen, presence and frequency on the output only."""
    vocab = logits.shape[-1]
    device = logits.device
    output_counts = torch.zeros_like(logits)
    for row, tokens in enumerate(outputs):
        if tokens:
            output_counts[row].index_add_(
                0, torch.tensor(tokens, device=device), torch.ones(len(tokens), device=device, dtype=logits.dtype)
            )
    if params.repetition_penalty != 1.0:
        seen = output_counts > 0
        for row, tokens in enumerate(prompts):
            seen[row, torch.tensor(tokens, device=device, dtype=torch.long).clamp(0, vocab - 1)] = True
        penalised = torch.where(logits > 0, logits / params.repetition_penalty, logits * params.repetition_penalty)
        logits = torch.where(seen, penalised, logits)
    logits = logits - params.frequency_penalty * output_counts
    return logits - params.presence_penalty * (output_counts > 0).to(logits.dtype)


def _keep_top_k(logits: torch.Tensor, k: int) -> torch.Tensor:
    if 0 < k < logits.shape[-1]:
        threshold = logits.topk(k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < threshold, float("-inf"))
    return logits


def _keep_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The smallest set of most likely tokens whose mass reaches `top_p`; the most likely token always stays."""
    if top_p >= 1.0:
        return probs
    sorted_probs, order = probs.sort(dim=-1, descending=True)
    outside = sorted_probs.cumsum(dim=-1) - sorted_probs > top_p
    sorted_probs[outside] = 0.0
    return torch.zeros_like(probs).scatter_(-1, order, sorted_probs)


def _keep_min_p(probs: torch.Tensor, min_p: float) -> torch.Tensor:
    """Tokens at least `min_p` times as likely as the most likely one."""
    if min_p <= 0.0:
        return probs
    floor = probs.max(dim=-1, keepdim=True).values * min_p
    return probs.masked_fill(probs < floor, 0.0)


def sample(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | None,
    prompts: Sequence[Sequence[int]] = (),
    outputs: Sequence[Sequence[int]] = (),
) -> torch.Tensor:
    """One token per row of `logits` (one row per sequence, with its prompt and output so far for the penalties).

    Greedy when `generator` is None.
    """
    logits = logits.float()
    if params.logit_bias:
        ids = torch.tensor(list(params.logit_bias), device=logits.device)
        bias = torch.tensor(list(params.logit_bias.values()), device=logits.device)
        logits = logits.index_add(-1, ids, bias.expand(logits.shape[0], -1))
    if params.penalised:
        logits = _apply_penalties(logits, params, prompts, outputs)
    if generator is None:
        return logits.argmax(dim=-1)
    logits = _keep_top_k(logits / params.temperature, params.top_k)
    probs = _keep_min_p(_keep_top_p(torch.softmax(logits, dim=-1), params.top_p), params.min_p)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
