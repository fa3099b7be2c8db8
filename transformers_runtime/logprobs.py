"""OpenAI's two logprobs shapes, built from the token logprobs of a choice.

Legacy completions take parallel lists (tokens, their logprobs, the most likely at each place, and
each token's offset in the choice's text); chat takes one entry per token with its UTF-8 bytes. A
token is shown as its own decoded text, as vLLM shows it: a byte-level token in the middle of a
character reads as U+FFFD there (or, with vLLM's `return_tokens_as_token_ids`, as `token_id:N`,
which names every token exactly). A stream sends the entries of each delta's tokens with that delta;
the offsets continue from chunk to chunk.
"""

from collections.abc import Sequence

from api.vllm_surface.completions import ChatLogprobs, CompletionLogprobs, TokenLogprobs, TopLogprob

from .generation import TokenLogprob
from .text import TextCodec


def render(
    codec: TextCodec, entries: Sequence[TokenLogprob], chat: bool, as_ids: bool, offset: int = 0
) -> tuple[CompletionLogprobs | ChatLogprobs, int]:
    """The logprobs of `entries` in the chat or completions shape, and the text offset after them."""
    tokens = {token for entry in entries for token in (entry.token, *(t for t, _ in entry.top))}
    decode = {token: f"token_id:{token}" if as_ids else codec.decode([token]) for token in tokens}
    if chat:
        content = [
            TokenLogprobs(
                **TopLogprob.of(decode[entry.token], entry.logprob).model_dump(),
                top_logprobs=[TopLogprob.of(decode[token], logprob) for token, logprob in entry.top],
            )
            for entry in entries
        ]
        return ChatLogprobs(content=content), offset
    lists = CompletionLogprobs()
    for entry in entries:
        text = decode[entry.token]
        top = {decode[token]: logprob for token, logprob in entry.top}
        if entry.top:  # vLLM lists the chosen token among the most likely, even when it is not one of them
            top.setdefault(text, entry.logprob)
        lists.add(text, entry.logprob, top, offset)
        offset += len(text)
    return lists, offset
