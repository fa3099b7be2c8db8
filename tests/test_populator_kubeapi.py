"""The populator's API calls: preconditioned deletes and what their answers mean, the stuck label
patch (NotFound ignored, other errors raised) and the Event it records (status writes: test_conditions.py)."""

from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from api import keys
from controller.populator.kubeapi import DeleteOutcome, KubeLauncherApi
from tests.test_populator_fakes import launcher


class FakeApi:
    """A fake of the few CoreV1Api, CustomObjectsApi and EventRecorder methods the populator calls: it
    records each call and answers with `error` when set, as the API server would, so every answer can
    be tested without a cluster."""

    def __init__(self, error: ApiException | None = None) -> None:
        self.error = error
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, method: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> None:
            self.calls.append((method, args, kwargs))
            if self.error is not None:
                raise self.error

        return call


POD = launcher("launcher-a", "hash")


def launcher_api(core: FakeApi) -> KubeLauncherApi:
    return KubeLauncherApi(core, FakeApi(), "ns")


@pytest.mark.parametrize(
    ("status", "outcome"), [(None, DeleteOutcome.DELETED), (404, DeleteOutcome.GONE), (409, DeleteOutcome.CONFLICT)]
)
async def test_deletes_are_preconditioned_on_what_was_read(status: int | None, outcome: DeleteOutcome) -> None:
    core = FakeApi(ApiException(status=status) if status else None)
    assert await launcher_api(core).delete(POD) is outcome
    [(_, args, kwargs)] = core.calls
    assert args == ("launcher-a", "ns")
    assert kwargs == {"body": {"preconditions": {"uid": "launcher-a-uid", "resourceVersion": "1"}}}


async def test_other_delete_errors_are_raised() -> None:
    with pytest.raises(ApiException):
        await launcher_api(FakeApi(ApiException(status=500))).delete(POD)


@pytest.mark.parametrize(("stuck", "value"), [(True, "true"), (False, None)])
async def test_the_stuck_label_is_merge_patched(stuck: bool, value: str | None) -> None:
    core = FakeApi()
    assert await launcher_api(core).set_stuck_label(POD, stuck)
    [(method, args, kwargs)] = core.calls
    assert (method, args) == (
        "patch_namespaced_pod",
        ("launcher-a", "ns", {"metadata": {"labels": {keys.LAUNCHER_STUCK_LABEL: value}}}),
    )
    assert kwargs == {"_content_type": "application/merge-patch+json"}


async def test_a_label_patch_on_a_gone_pod_is_ignored_and_other_errors_are_raised() -> None:
    assert not await launcher_api(FakeApi(ApiException(status=404))).set_stuck_label(POD, True)
    with pytest.raises(ApiException):
        await launcher_api(FakeApi(ApiException(status=403))).set_stuck_label(POD, True)


async def test_the_warning_event_is_recorded_against_the_pod() -> None:
    events = FakeApi()
    await KubeLauncherApi(FakeApi(), events, "ns").warn(POD, "LauncherStuck", "why")
    assert events.calls == [("record", (POD, "Warning", "LauncherStuck", "why"), {})]
