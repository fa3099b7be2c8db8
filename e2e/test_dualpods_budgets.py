"""E3: a LauncherConfig's host-memory budget for sleeping instances, enforced with LRU eviction.

Launchers run the stand-in server (instances are cheap and start at once); the budget is set from
the measured size of one instance, so that exactly one sleeper fits.
"""

from api import keys
from api.crds import GROUP, VERSION, LauncherConfig
from e2e.dualpods_env import DualPodsEnv
from e2e.waiting import wait_for

RS = "budgeted"


async def _switch(env: DualPodsEnv, isc: str, launcher: str) -> None:
    await env.scale(RS, 0)
    await env.wait_gone(RS)

    async def unbound() -> bool:
        return keys.REQUESTER_ANNOTATION not in ((await env.pod(launcher))["metadata"].get("annotations") or {})

    await wait_for(unbound, what="the launcher unbound")
    await env.set_requester_isc(RS, isc)
    await env.scale(RS, 1)
    requester = await env.ready_requester(RS)
    assert requester["metadata"]["labels"][keys.DUAL_LABEL] == launcher


async def test_least_recently_used_sleeper_makes_room(env: DualPodsEnv) -> None:
    await env.create_launcher_config("lc", max_instances=3, launcher_args=["--stand-in"])
    # Without a policy asking for it, the populator deletes a launcher once it is unbound.
    await env.create_population_policy("keep-one", "lc", count=1)
    for isc, port in (("isc-a", 8005), ("isc-b", 8006), ("isc-c", 8007)):
        await env.create_isc(isc, "lc", port=port, options=f"--model {isc}")
    node = (await env.cluster.kubelet.nodes())[0]
    await env.create_requesters(RS, "isc-a", node=node.name, gpu=sorted(node.gpus)[0])
    launcher = (await env.launcher_of(await env.ready_requester(RS)))["metadata"]["name"]

    one_instance = (await env.instances(await env.pod(launcher)))["instances"][0]["process"]["rss_bytes"]
    budget = int(one_instance * 1.5)  # one sleeper fits, two do not
    await env.objects.patch_namespaced_custom_object(
        GROUP, VERSION, env.namespace, LauncherConfig.RESOURCE.plural, "lc",
        {"spec": {"sleeperBudget": {"hostMemoryBytes": budget}}}, _content_type="application/merge-patch+json",
    )  # fmt: skip

    await _switch(env, "isc-b", launcher)  # isc-a sleeps: alone it fits
    listing = await env.instances(await env.pod(launcher))
    assert sorted((i["annotations"]["isc-name"], i["sleeping"]) for i in listing["instances"]) == [
        ("isc-a", True),
        ("isc-b", False),
    ]

    await _switch(env, "isc-c", launcher)  # isc-b sleeps: isc-a, used longest ago, makes room
    listing = await env.instances(await env.pod(launcher))
    assert sorted((i["annotations"]["isc-name"], i["sleeping"]) for i in listing["instances"]) == [
        ("isc-b", True),
        ("isc-c", False),
    ]
    events = await env.core.list_namespaced_event(env.namespace, field_selector=f"involvedObject.name={launcher}")
    assert any(e.reason == "SleeperBudget" and "host budget" in e.message for e in events.items)
