"""The text of a generated sequence, token by token: what is final, and when and why it ends.

Text leaves as deltas the moment it is final: a stop sequence could still be forming at the end of
the text (so the last `len(stop) - 1` characters wait), and a byte-level tokenizer may be in the
middle of a UTF-8 character (a trailing U+FFFD waits). The concatenated deltas of a sequence are
therefore exactly its final text, streamed or not.

The text grows by decoding a short window of the latest tokens, not every token again (vLLM's
incremental detokenization): the window starts at the last token boundary where the text was
complete, so a tokenizer that decodes a token differently after another (a leading-space marker)
still sees its context, and a token costs the same at the end of a long answer as at the start.
"""

from collections.abc import Callable
from dataclasses import dataclass

from api.vllm_surface.completions import FinishReason

from .sampling import SamplingParams
from .text import TextCodec


@dataclass(frozen=True)
class TokenLogprob:
    """A generated token's log-probability under the model, and the `top` most likely tokens at its place."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Delta:
    """New text of sequence `index`; the last delta of a sequence says why it ended."""

    index: int
    text: str
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None  # the stop string or stop token id that matched
    tokens: int = 0  # on the last delta: the tokens the sequence generated (EOS included, as vLLM counts)
    logprobs: tuple[TokenLogprob, ...] = ()  # of the tokens generated since the previous delta, when asked for
    token_ids: tuple[int, ...] = ()  # on the last delta: those tokens


Emit = Callable[[Delta], None]


def _first_stop(text: str, stops: tuple[str, ...], start: int) -> tuple[int, str] | None:
    """The earliest stop sequence in `text` at or after `start` (nothing before it was sent or can match)."""
    found = [(position, stop) for stop in stops if (position := text.find(stop, start)) >= 0]
    return min(found) if found else None


class TextSequence:
    """One generated sequence's tokens and text: it settles what may be sent and says when it ends."""

    def __init__(self, index: int, params: SamplingParams, max_tokens: int, codec: TextCodec, emit: Emit) -> None:
        self.index = index
        self.token_ids: list[int] = []
        self.text = ""
        self.sent = 0  # characters of `text` already emitted
        self._complete = ""  # the text of token_ids[:self._read], which later tokens do not change
        self._window = 0  # the first token decoded again with each new one
        self._read = 0
        self._read_text = ""  # the text of token_ids[self._window:self._read]
        self._unsent: list[TokenLogprob] = []  # logprobs of the tokens since the last delta
        self.finished = False
        self._stops = params.stop
        self._stop_ids = params.stop_token_ids
        self._eos_ids = frozenset() if params.ignore_eos else codec.eos_ids
        self._include_stop = params.include_stop
        self._holdback = max((len(stop) for stop in params.stop), default=1) - 1
        self._max_tokens = max_tokens
        self._codec = codec
        self._emit = emit

    def push(self, token: int, logprob: TokenLogprob | None = None) -> None:
        self.token_ids.append(token)
        if logprob is not None:
            self._unsent.append(logprob)
        if token in self._eos_ids:
            self.finish("stop")
            return
        if token in self._stop_ids:  # vLLM's stop_token_ids: the token ends the text but is not part of it
            self.finish("stop", token)
            return
        text = self._decode_new()
        hit = _first_stop(text, self._stops, self.sent)
        if hit is not None:
            position, stop = hit
            self.text = text[: position + len(stop) if self._include_stop else position]
            self.finish("stop", stop)
            return
        self.text = text
        if len(self.token_ids) >= self._max_tokens:
            self.finish("length")
            return
        settled = min(len(text.rstrip("\ufffd")), len(text) - self._holdback)
        if settled > self.sent:
            self._emit(Delta(self.index, text[self.sent : settled], logprobs=self._take_logprobs()))
            self.sent = settled

    def _decode_new(self) -> str:
        """The whole text so far, decoding only the window of tokens since the last complete boundary."""
        window = self._codec.decode(self.token_ids[self._window :])
        if not window.startswith(self._read_text):  # a tokenizer whose text is not additive here: decode it all
            return self._codec.decode(self.token_ids)
        text = self._complete + window[len(self._read_text) :]
        if not text.endswith("\ufffd"):  # no character in the making: a boundary to start the next window at
            self._complete, self._window, self._read = text, self._read, len(self.token_ids)
            self._read_text = self._codec.decode(self.token_ids[self._window : self._read])
        return text

    def finish(self, reason: FinishReason, stop: str | int | None = None) -> None:
        self.finished = True
        self._emit(
            Delta(
                self.index,
                self.text[self.sent :],
                reason,
                stop,
                len(self.token_ids),
                self._take_logprobs(),
                tuple(self.token_ids),
            )
        )
        self.sent = len(self.text)

    def _take_logprobs(self) -> tuple[TokenLogprob, ...]:
        taken = tuple(self._unsent)
        self._unsent.clear()
        return taken
