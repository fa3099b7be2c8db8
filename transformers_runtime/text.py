"""Text to token ids and back, around one Hugging Face tokenizer shared by two threads.

Handlers tokenize on the event loop (to refuse an over-long prompt before it queues) while the model
thread decodes; a fast tokenizer is a Rust object that may raise "Already borrowed" when two threads
use it at once, so every call takes one lock.
"""

import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any


class NoChatTemplate(ValueError):
    """The tokenizer has no chat template, so chat completions cannot be rendered."""


class TextCodec:
    def __init__(self, tokenizer: Any, extra_eos_ids: Iterable[int] = ()) -> None:
        self._tokenizer = tokenizer
        self._lock = threading.Lock()
        eos = {tokenizer.eos_token_id, *extra_eos_ids}
        self.eos_ids = frozenset(i for i in eos if i is not None)

    @classmethod
    def load(cls, path: Path, eos_ids: Iterable[int], trust_remote_code: bool = False) -> "TextCodec":
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=trust_remote_code)
        return cls(tokenizer, eos_ids)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        with self._lock:
            ids: list[int] = self._tokenizer.encode(text, add_special_tokens=add_special_tokens)
        return ids

    def render_chat(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
        """The conversation through the model's chat template, as token ids.

        The template writes the special tokens it wants (e.g. BOS), so none are added on top — vLLM's
        default for chat as well.
        """
        with self._lock:
            if not self._tokenizer.chat_template:
                raise NoChatTemplate("the model has no chat template, so it cannot serve chat completions")
            text: str = self._tokenizer.apply_chat_template(
                messages, add_generation_prompt=add_generation_prompt, tokenize=False
            )
            ids: list[int] = self._tokenizer.encode(text, add_special_tokens=False)
        return ids

    def decode(self, ids: list[int]) -> str:
        with self._lock:
            text: str = self._tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)
        return text
