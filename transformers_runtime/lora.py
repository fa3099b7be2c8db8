"""LoRA adapters through peft (as transformers integrates it), with vLLM's endpoints, rules and messages.

Two sides, two owners. `AdapterRegistry` is the event loop's: the adapter names clients may use,
and vLLM's load/unload checks. `AdapterSlots` is the model thread's: which adapters are attached to
the model right now — at most `--max-loras`, the least recently used detached first and attached
again from its path when next asked for (vLLM keeps evicted adapters in a CPU cache instead). A
level-2 wake loads a fresh model without adapters, and they come back the same way.
"""

import argparse
import json
from collections.abc import Collection, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from api.openai_errors import ApiError


@dataclass(frozen=True)
class Adapter:
    name: str
    path: str
    base_model_name: str | None = None


def parse_lora_module(spec: str) -> Adapter:
    """vLLM's `--lora-modules` item: `name=path`, or JSON `{"name", "path", "base_model_name"}`."""
    if spec.lstrip().startswith("{"):
        try:
            fields = json.loads(spec)
            return Adapter(str(fields["name"]), str(fields["path"]), fields.get("base_model_name"))
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise argparse.ArgumentTypeError(f"invalid LoRA module JSON {spec!r}: {error}") from None
    name, _, path = spec.partition("=")
    if not name or not path:
        raise argparse.ArgumentTypeError(f"a LoRA module is name=path or JSON, got {spec!r}")
    return Adapter(name, path)


class AdapterRegistry:
    """The adapters clients can name in `model`; event-loop side."""

    def __init__(self, base_names: Collection[str]) -> None:
        self._base_names = frozenset(base_names)
        self._adapters: dict[str, Adapter] = {}
        self._busy: set[str] = set()  # names being loaded or unloaded right now

    def __len__(self) -> int:
        return len(self._adapters)

    def __iter__(self) -> Iterator[Adapter]:
        return iter(list(self._adapters.values()))

    def lookup(self, name: str) -> Adapter | None:
        return self._adapters.get(name)

    def _check_new(self, adapter: Adapter) -> None:
        if not adapter.name or not adapter.path:
            raise ApiError(400, "Both 'lora_name' and 'lora_path' must be provided.", err_type="InvalidUserInput")
        if adapter.name in self._base_names:
            raise ApiError(
                400,
                f"The lora adapter '{adapter.name}' conflicts with a served base model.",
                err_type="InvalidUserInput",
            )
        if adapter.name in self._adapters or adapter.name in self._busy:
            raise ApiError(
                400, f"The lora adapter '{adapter.name}' has already been loaded.", err_type="InvalidUserInput"
            )

    def register(self, adapter: Adapter) -> None:
        """Add a name at once (the static `--lora-modules`, attached before the server opens)."""
        self._check_new(adapter)
        self._adapters[adapter.name] = adapter

    @contextmanager
    def loading(self, adapter: Adapter) -> Iterator[None]:
        """Reserve the name while the body loads the adapter; register it if the body succeeds."""
        self._check_new(adapter)
        self._busy.add(adapter.name)
        try:
            yield
            self._adapters[adapter.name] = adapter
        finally:
            self._busy.discard(adapter.name)

    @contextmanager
    def unloading(self, name: str) -> Iterator[Adapter]:
        """Withdraw the name at once (new requests get 404); put it back if the body fails."""
        if not name:
            raise ApiError(
                400, "'lora_name' needs to be provided to unload a LoRA adapter.", err_type="InvalidUserInput"
            )
        adapter = self._adapters.pop(name, None)
        if adapter is None:
            raise ApiError(404, f"The lora adapter '{name}' cannot be found.")
        self._busy.add(name)
        try:
            yield adapter
        except BaseException:
            self._adapters[name] = adapter
            raise
        finally:
            self._busy.discard(name)


class AdapterSlots:
    """The adapters attached to the model; model-thread side, `capacity` at most."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._recent: list[str] = []  # least recently used first

    @staticmethod
    def attached(model: Any) -> list[str]:
        return list(model.peft_config) if getattr(model, "_hf_peft_config_loaded", False) else []

    def _lru_order(self, model: Any) -> list[str]:
        attached = self.attached(model)
        return [n for n in attached if n not in self._recent] + [n for n in self._recent if n in attached]

    def attach(self, model: Any, adapter: Adapter) -> None:
        """Load the adapter into the model (detaching the least recently used ones to make room)."""
        if not (Path(adapter.path) / "adapter_config.json").is_file():
            raise ApiError(404, f"Loading lora {adapter.name} failed: No adapter found for {adapter.path}")
        order = self._lru_order(model)
        while len(order) >= self.capacity:
            self.detach(model, order.pop(0))
        try:
            # Never a download (transformers 5.19 mishandles its own `local_files_only=`; the hub kwargs work).
            model.load_adapter(adapter.path, adapter_name=adapter.name, adapter_kwargs={"local_files_only": True})
        except Exception as error:
            if adapter.name in self.attached(model):  # injected, then the weights did not fit
                model.delete_adapter(adapter.name)
            raise ApiError(400, f"Loading lora {adapter.name} failed: {error}") from error
        self._recent = [*self._lru_order(model), adapter.name]

    def detach(self, model: Any, name: str) -> None:
        if name in self.attached(model):
            model.delete_adapter(name)
        if name in self._recent:
            self._recent.remove(name)

    def activate(self, model: Any, adapter: Adapter | None) -> None:
        """Make the next forward passes use `adapter`, or the plain base model for None."""
        if adapter is None:
            if self.attached(model):
                model.disable_adapters()
            return
        if adapter.name not in self.attached(model):
            self.attach(model, adapter)
        self._recent = [*(n for n in self._lru_order(model) if n != adapter.name), adapter.name]
        model.enable_adapters()
        model.set_adapter(adapter.name)
