"""An informer: a local cache of one kind of object, kept current by list + watch, with indexes.

Objects are the API server's JSON (dicts), never mutated in place: a change replaces the object. The
cache is fed by the controllers' one list/watch loop (kube.listwatch): lists are paged
(`limit`/`continue`), the watch resumes from the last resourceVersion it saw, and when that is gone
(410 Gone, "resourceVersion too old") it lists again and emits the differences, so handlers see every
change as (old, new) pairs exactly once per observed version. Objects are read with `decode`, which shares
their keys and short strings, and trimmed before they are cached (`trim`: no managedFields field sets, no
last-applied annotation). `upsert` and `remove` load the cache by hand (tests, and a controller that learns of
a change before its watch does).
"""

import asyncio
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

import aiohttp
import pydantic_core

from kube.backoff import Backoff
from kube.listwatch import Expired, lines, list_and_watch

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Handler = Callable[[Obj | None, Obj | None], None]
IndexFunc = Callable[[Obj], Iterable[str]]

WATCH_TIMEOUT_S = 290  # the API server ends each watch after this; the informer resumes it
# No byte for this long (not even a bookmark) on a watch: taken for a half-open connection and resumed.
WATCH_SILENCE_S = WATCH_TIMEOUT_S + 30
LIST_PAGE_SIZE = 500
LIST_TIMEOUT = aiohttp.ClientTimeout(total=60, connect=10)
STREAM_TIMEOUT = aiohttp.ClientTimeout(total=None, connect=10, sock_connect=10)


LAST_APPLIED = "kubectl.kubernetes.io/last-applied-configuration"
MANAGED_FIELDS_KEPT = ("manager", "operation", "time")


def decode(data: bytes | str) -> Any:
    """JSON as the controllers read the API server's objects: with pydantic-core's parser, whose string cache
    gives the objects of a cache one copy of the keys and short strings they have in common ("metadata",
    "True", a node's name, an image) where json.loads made new ones for each object. Shared, a cached launcher
    Pod took 14.3 KiB instead of 27.9 KiB (5,000 launchers, docs/benchmarks.md); sharing them by hand
    (`sys.intern` over every object json.loads made) had cost a sixth of a controller's CPU."""
    return pydantic_core.from_json(data, cache_strings="all")


def trim(obj: Obj) -> Obj:
    """What a cache keeps of an object: each managedFields entry without its field set (who wrote it and
    when stays, which is all a controller reads of it) and without kubectl's last-applied annotation (a copy
    of the object as applied). Together they were nearly half of a Pod's JSON (docs/benchmarks.md). Writes
    never send them back (PodWriter patches what it changes; status writes leave managedFields out), so the
    API server keeps its own."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        fields = meta.get("managedFields")
        if fields:
            meta["managedFields"] = [{k: e[k] for k in MANAGED_FIELDS_KEPT if k in e} for e in fields]
        annotations = meta.get("annotations")
        if annotations and LAST_APPLIED in annotations:
            meta["annotations"] = {k: v for k, v in annotations.items() if k != LAST_APPLIED}
    return obj


class ListWatchFunction(Protocol):
    """A kubernetes-asyncio list method bound to its scope (namespace, group...), e.g.
    `functools.partial(CoreV1Api(api).list_namespaced_pod, "ns")`."""

    def __call__(self, **kwargs: Any) -> Awaitable[aiohttp.ClientResponse]: ...


def object_key(obj: Obj) -> str:
    meta = obj["metadata"]
    namespace = meta.get("namespace")
    return f"{namespace}/{meta['name']}" if namespace else str(meta["name"])


class Informer:
    def __init__(
        self,
        name: str,
        list_watch: ListWatchFunction,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> None:
        self.name = name
        self._list_watch = list_watch
        selectors = {"label_selector": label_selector, "field_selector": field_selector}
        self._selector = {kind: selector for kind, selector in selectors.items() if selector}
        self._store: dict[str, Obj] = {}
        self._indexers: dict[str, IndexFunc] = {}
        self._indexes: dict[str, defaultdict[str, set[str]]] = {}
        self._handlers: list[Handler] = []
        self._resource_version = ""
        self._backoff = Backoff()
        self.synced = asyncio.Event()

    # ----- reading the cache

    def get(self, key: str) -> Obj | None:
        return self._store.get(key)

    def items(self) -> list[Obj]:
        return list(self._store.values())

    def by_index(self, index: str, value: str) -> list[Obj]:
        return [self._store[k] for k in sorted(self._indexes[index].get(value, ()))]

    def count(self, index: str, value: str) -> int:
        """How many objects `by_index` would return, without building the list."""
        return len(self._indexes[index].get(value, ()))

    def add_index(self, name: str, func: IndexFunc) -> None:
        self._indexers[name] = func
        index: defaultdict[str, set[str]] = defaultdict(set)
        for key, obj in self._store.items():
            for value in func(obj):
                index[value].add(key)
        self._indexes[name] = index

    def subscribe(self, handler: Handler) -> None:
        self._handlers.append(handler)

    # ----- loading it

    def upsert(self, obj: Obj) -> None:
        """Put `obj` in the cache (handlers are told), unless the cached copy has its resourceVersion."""
        self._apply(object_key(obj), trim(obj))

    def remove(self, key: str) -> None:
        """Drop the object at `key` (handlers are told)."""
        self._apply(key, None)

    # ----- keeping it current

    async def run(self) -> None:
        """List, then watch, until cancelled."""
        await list_and_watch(self, self._backoff)

    async def list(self) -> None:
        """All objects, page by page, replacing the cache; the watch resumes from the list's version."""
        fresh: dict[str, Obj] = {}
        token: str | None = None
        while True:
            page = await self._call(limit=LIST_PAGE_SIZE, _continue=token, _request_timeout=LIST_TIMEOUT)
            kind = str(page.get("kind", "")).removesuffix("List")
            for item in page.get("items") or []:
                # List items lack kind/apiVersion; fill them so cached objects look like watched ones.
                item.setdefault("kind", kind)
                item.setdefault("apiVersion", page.get("apiVersion"))
                fresh[object_key(item)] = trim(item)
            token = page["metadata"].get("continue") or None
            if token is None:
                break
        for key in [k for k in self._store if k not in fresh]:
            self._apply(key, None)
        for key, obj in fresh.items():
            self._apply(key, obj)
        self._resource_version = str(page["metadata"]["resourceVersion"])
        self.synced.set()

    async def watch(self) -> None:
        """Follow the changes until the API server ends the watch; Expired once its version is gone."""
        response = await self._list_watch(
            watch=True,
            resource_version=self._resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=WATCH_TIMEOUT_S,
            _preload_content=False,
            _request_timeout=STREAM_TIMEOUT,
            **self._selector,
        )
        async with response:
            if response.status == 410:
                raise Expired("410 Gone")
            if response.status != 200:
                raise RuntimeError(f"watch answered {response.status}: {(await response.text())[:500]}")
            self._backoff.reset()
            async for line in lines(response.content, WATCH_SILENCE_S):
                if line.strip():
                    self._on_event(decode(line))

    async def _call(self, **kwargs: Any) -> Obj:
        response = await self._list_watch(_preload_content=False, **self._selector, **kwargs)
        async with response:
            body: Obj = decode(await response.read())
        if response.status == 410:  # a list's continue token expired: start over
            raise Expired(f"list: {body.get('message')}")
        if response.status != 200:
            raise RuntimeError(f"list answered {response.status}: {body}")
        return body

    def _on_event(self, event: Obj) -> None:
        kind, obj = event["type"], trim(event["object"])
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Expired(str(obj.get("message")))
            raise RuntimeError(f"watch error: {obj.get('message')}")
        if kind in ("ADDED", "MODIFIED"):
            self._apply(object_key(obj), obj)
        elif kind == "DELETED":
            self._apply(object_key(obj), None)
        self._resource_version = _version(obj) or self._resource_version

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
