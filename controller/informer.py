"""An informer: a local cache of one kind of object, kept current by list + watch, with indexes.

Objects are the API server's JSON (dicts). The cache lists once, then watches from the list's
resourceVersion; when the watch expires (410 Gone) or fails it lists again and emits the differences,
so handlers see every change as (old, new) pairs exactly once per observed version.
"""

import asyncio
import json
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import aiohttp

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Handler = Callable[[Obj | None, Obj | None], None]
IndexFunc = Callable[[Obj], Iterable[str]]

WATCH_TIMEOUT_S = 290
RETRY_MAX_S = 30.0


class ListWatchFunction(Protocol):
    """A kubernetes-asyncio list method bound to its scope (namespace, group...), e.g.
    `functools.partial(CoreV1Api(api).list_namespaced_pod, "ns")`."""

    def __call__(self, **kwargs: Any) -> Awaitable[aiohttp.ClientResponse]: ...


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410 Gone): list again."""


def object_key(obj: Obj) -> str:
    meta = obj["metadata"]
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


class Informer:
    def __init__(self, name: str, list_watch: ListWatchFunction, label_selector: str | None = None) -> None:
        self.name = name
        self._list_watch = list_watch
        self._selector = {"label_selector": label_selector} if label_selector else {}
        self._store: dict[str, Obj] = {}
        self._indexers: dict[str, IndexFunc] = {}
        self._indexes: dict[str, defaultdict[str, set[str]]] = {}
        self._handlers: list[Handler] = []
        self.synced = asyncio.Event()

    # ----- reading the cache

    def get(self, key: str) -> Obj | None:
        return self._store.get(key)

    def items(self) -> list[Obj]:
        return list(self._store.values())

    def by_index(self, index: str, value: str) -> list[Obj]:
        return [self._store[k] for k in sorted(self._indexes[index].get(value, ()))]

    def add_index(self, name: str, func: IndexFunc) -> None:
        self._indexers[name] = func
        index: defaultdict[str, set[str]] = defaultdict(set)
        for key, obj in self._store.items():
            for value in func(obj):
                index[value].add(key)
        self._indexes[name] = index

    def subscribe(self, handler: Handler) -> None:
        self._handlers.append(handler)

    # ----- keeping it current

    async def run(self) -> None:
        delay = 0.5
        while True:
            try:
                resource_version = await self._list()
                delay = 0.5
                await self._watch(resource_version)
            except asyncio.CancelledError:
                raise
            except WatchExpired:
                log.debug("%s: watch expired; listing again", self.name)
            except Exception as err:
                log.warning("%s: list/watch failed (%s); retrying in %.1f s", self.name, err, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, RETRY_MAX_S)

    async def _list(self) -> str:
        response = await self._list_watch(_preload_content=False, **self._selector)
        async with response:
            body = json.loads(await response.read())
        if response.status != 200:
            raise RuntimeError(f"list answered {response.status}: {body}")
        items: list[Obj] = body.get("items") or []
        kind = body.get("kind", "").removesuffix("List")
        api_version = body.get("apiVersion")
        fresh = {}
        for item in items:
            # List items lack kind/apiVersion; fill them so cached objects look like watched ones.
            item.setdefault("kind", kind)
            item.setdefault("apiVersion", api_version)
            fresh[object_key(item)] = item
        for key in [k for k in self._store if k not in fresh]:
            self._apply(key, None)
        for key, obj in fresh.items():
            self._apply(key, obj)
        self.synced.set()
        return str(body["metadata"]["resourceVersion"])

    async def _watch(self, resource_version: str) -> None:
        while True:
            response = await self._list_watch(
                watch=True,
                resource_version=resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=WATCH_TIMEOUT_S,
                _preload_content=False,
                _request_timeout=WATCH_TIMEOUT_S + 30,
                **self._selector,
            )
            async with response:
                if response.status == 410:
                    raise WatchExpired()
                if response.status != 200:
                    raise RuntimeError(f"watch answered {response.status}: {await response.text()}")
                async for line in response.content:
                    if line.strip():
                        resource_version = self._on_event(json.loads(line)) or resource_version

    def _on_event(self, event: Obj) -> str | None:
        kind, obj = event["type"], event["object"]
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise WatchExpired()
            raise RuntimeError(f"watch error: {obj.get('message')}")
        version = _version(obj)
        if kind in ("ADDED", "MODIFIED"):
            self._apply(object_key(obj), obj)
        elif kind == "DELETED":
            self._apply(object_key(obj), None)
        return version

    def _apply(self, key: str, new: Obj | None) -> None:
        old = self._store.get(key)
        if old is not None and new is not None and _version(old) == _version(new):
            return
        for name, func in self._indexers.items():
            if old is not None:
                for value in func(old):
                    self._indexes[name][value].discard(key)
            if new is not None:
                for value in func(new):
                    self._indexes[name][value].add(key)
        if new is None:
            if old is None:
                return
            del self._store[key]
        else:
            self._store[key] = new
        for handler in self._handlers:
            try:
                handler(old, new)
            except Exception:
                log.exception("%s: an event handler failed", self.name)


def _version(obj: Obj) -> str | None:
    version: str | None = obj.get("metadata", {}).get("resourceVersion")
    return version
