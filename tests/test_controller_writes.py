"""What the controllers cache of an object and what they send back: trimmed caches, metadata patches."""

import aiohttp
import pytest

from controller.dualpods.writer import merge_patch
from controller.informer import LAST_APPLIED, Informer, trim


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
