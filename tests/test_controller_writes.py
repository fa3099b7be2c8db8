"""What the controllers cache of an object and what they send back: trimmed caches, metadata patches, and
when a cached copy is older than the controller's own write."""

import json

import aiohttp
import pytest

from controller.dualpods.memory import Memory
from controller.dualpods.writer import merge_patch, metadata_patch
from kube.informer import LAST_APPLIED, Informer, decode, trim


def _pod() -> dict[str, object]:
    return {
        "metadata": {
            "name": "p",
            "namespace": "ns",
            "resourceVersion": "7",
            "annotations": {LAST_APPLIED: '{"big": "copy"}', "mine": "x"},
            "managedFields": [
                {
                    "manager": "dual-pods-controller",
                    "operation": "Update",
                    "time": "2026-12-01T10:00:00Z",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {}}},
                },
            ],
        },
        "spec": {"containers": []},
    }


def test_trim_keeps_who_wrote_when_and_drops_the_rest() -> None:
    trimmed = trim(_pod())
    meta = trimmed["metadata"]
    assert isinstance(meta, dict)
    assert meta["annotations"] == {"mine": "x"}
    assert meta["managedFields"] == [
        {"manager": "dual-pods-controller", "operation": "Update", "time": "2026-12-01T10:00:00Z"}
    ]


def test_the_cache_holds_trimmed_objects() -> None:
    async def never(**_: object) -> aiohttp.ClientResponse:
        raise AssertionError("not listed in this test")

    informer = Informer("pods", never)
    informer.upsert(_pod())
    cached = informer.get("ns/p")
    assert cached is not None
    assert LAST_APPLIED not in cached["metadata"]["annotations"]
    assert "fieldsV1" not in cached["metadata"]["managedFields"][0]


def test_cached_objects_share_their_keys_and_short_strings() -> None:
    """Each object is read from its own JSON; the cache keeps one copy of what they have in common."""

    async def never(**_: object) -> aiohttp.ClientResponse:
        raise AssertionError("not listed in this test")

    informer = Informer("pods", never)
    long = "x" * 200
    for name in ("a", "b"):
        pod = {"metadata": {"name": name, "namespace": "ns", "annotations": {"big": long}}}
        informer.upsert(decode(json.dumps(pod)))
    a, b = informer.get("ns/a"), informer.get("ns/b")
    assert a is not None
    assert b is not None
    assert a["metadata"]["namespace"] is b["metadata"]["namespace"]
    assert next(iter(a["metadata"])) is next(iter(b["metadata"])), "the key 'name'"
    assert a["metadata"]["annotations"]["big"] == long
    assert a["metadata"]["annotations"]["big"] is not b["metadata"]["annotations"]["big"], "long values not shared"


@pytest.mark.parametrize(
    ("old", "new", "patch"),
    [
        ({"labels": {"a": "1"}}, {"labels": {"a": "1"}}, {}),
        ({"labels": {"a": "1"}}, {"labels": {"a": "2", "b": "3"}}, {"labels": {"a": "2", "b": "3"}}),
        ({"labels": {"a": "1", "b": "2"}}, {"labels": {"b": "2"}}, {"labels": {"a": None}}),
        ({}, {"annotations": {"k": "v"}}, {"annotations": {"k": "v"}}),
        ({"finalizers": ["x"]}, {"finalizers": ["x", "y"]}, {"finalizers": ["x", "y"]}),
        ({"finalizers": ["x"]}, {"finalizers": []}, {"finalizers": []}),
        ({"labels": {"a": "1"}}, {}, {"labels": None}),
    ],
)
def test_merge_patch_carries_only_the_change(
    old: dict[str, object], new: dict[str, object], patch: dict[str, object]
) -> None:
    assert merge_patch(old, new) == patch


@pytest.mark.parametrize(
    ("old", "new", "patch"),
    [
        ({"annotations": {"k": "v"}}, {"annotations": {"k": "w"}}, {"annotations": {"k": "w"}}),
        ({"finalizers": ["x"]}, {"finalizers": ["x", "y"]}, {"finalizers": ["y"]}),
        ({"finalizers": ["x", "y"]}, {"finalizers": ["y"]}, {"$deleteFromPrimitiveList/finalizers": ["x"]}),
        ({}, {"finalizers": ["x"], "labels": {"a": "1"}}, {"finalizers": ["x"], "labels": {"a": "1"}}),
        ({"finalizers": ["x"]}, {"finalizers": ["x"]}, {}),
    ],
)
def test_a_metadata_patch_adds_and_removes_finalizers_one_by_one(
    old: dict[str, object], new: dict[str, object], patch: dict[str, object]
) -> None:
    """The finalizers of a strategic merge patch merge with the Pod's: what another client added stays."""
    assert metadata_patch(old, new) == patch


def _versioned(uid: str, version: str) -> dict[str, object]:
    return {"metadata": {"name": uid, "uid": uid, "resourceVersion": version}}


def test_a_cached_pod_is_behind_until_it_shows_the_controllers_write() -> None:
    memory = Memory()
    memory.wrote(_versioned("a", "10"), "12")
    assert memory.behind(_versioned("a", "10")), "the copy the write was made from"
    assert memory.behind(_versioned("a", "11")), "a copy between the read and the write"
    assert not memory.behind(_versioned("b", "1")), "a Pod not written"
    assert not memory.behind(_versioned("a", "13")), "a copy that shows the write and more"
    assert not memory.behind(_versioned("a", "10")), "caught up once, the write is forgotten"
    assert not memory.behind(None)


@pytest.mark.parametrize("version", ["", "0012", "abc", "\uff11\uff12"])
def test_a_version_that_is_not_an_integer_is_never_behind(version: str) -> None:
    memory = Memory()
    memory.wrote(_versioned("a", "10"), "12")
    assert not memory.behind(_versioned("a", version))
    memory.wrote(_versioned("a", "10"), version)
    assert not memory.behind(_versioned("a", "1"))
