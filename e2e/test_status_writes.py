"""A status is written to the real API server only when it would change (controller/status_writer.py): a
replace at the object's resourceVersion, nothing for an unchanged status, a 409 for a stale copy, nothing for
a deleted object."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from kubernetes_asyncio import client

from api.crds import GROUP, VERSION, LauncherPopulationPolicy, Status
from controller.conditions import Fault, Readiness, computed, current
from controller.status_writer import StatusWriter

T0 = datetime(2026, 12, 1, 10, 0, 0, tzinfo=UTC)
T1 = T0 + timedelta(minutes=5)
MISSING = Fault("LauncherConfigNotFound", "LauncherConfig x does not exist")


def lpp(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "LauncherPopulationPolicy",
        "metadata": {"name": name},
        "spec": {"enhancedNodeSelector": {"labelSelector": {}}, "countForLauncher": []},
    }


@pytest.mark.usefixtures("crds")
async def test_statuses_are_replaced_on_the_api_server_only_when_they_change(
    api: client.ApiClient, namespace: str
) -> None:
    objects = client.CustomObjectsApi(api)
    plural = LauncherPopulationPolicy.RESOURCE.plural

    async def read() -> dict[str, Any]:
        found: dict[str, Any] = await objects.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, "p")
        return found

    await objects.create_namespaced_custom_object(GROUP, VERSION, namespace, plural, lpp("p"))
    writer = StatusWriter(objects, namespace)
    stalled = computed(Status(), 1, [MISSING], Readiness(True, "Populated"), T0)
    assert await writer.write(LauncherPopulationPolicy, await read(), stalled)
    shown = await read()
    assert current(Status, shown) == stalled
    assert shown["status"]["conditions"][1]["lastTransitionTime"] == "2026-12-01T10:00:00Z"
    again = computed(current(Status, shown), 1, [MISSING], Readiness(True, "Populated"), T1)
    assert not await writer.write(LauncherPopulationPolicy, shown, again), "nothing changed: no write"
    assert (await read())["metadata"]["resourceVersion"] == shown["metadata"]["resourceVersion"]
    clean = computed(current(Status, shown), 1, [], Readiness(True, "Populated"), T1)
    assert await writer.write(LauncherPopulationPolicy, shown, clean)
    cleared = await read()
    assert "errors" not in cleared["status"], "a replace: emptied errors disappear"
    assert "message" not in cleared["status"]["conditions"][1], "an empty message is left out"
    assert current(Status, cleared) == clean
    stale = computed(current(Status, cleared), 1, [MISSING], Readiness(True, "Populated"), T1)
    with pytest.raises(client.ApiException) as conflict:
        await writer.write(LauncherPopulationPolicy, shown, stale)  # an older copy: the API server refuses it
    assert conflict.value.status == 409
    assert not await writer.write(LauncherPopulationPolicy, lpp("gone"), stale), "deleted: dropped"
