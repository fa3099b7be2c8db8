"""An upgrade from the previous release with exactly the commands docs/upgrade.md gives, on the loopback cluster.

The previous release's chart is e2e/fixture_charts/dualpods-0.1.0.tgz: `helm package` of `charts/dualpods` at tag
v0.1.0 (commit 5eec9d2; its CRDs were symlinks then, which `helm package` resolves), kept here so that a shallow
clone can run this test. It is installed with a user's values and its own CRDs; a requester is served and scaled to
0, which leaves its instance asleep in its launcher (kept by a population policy). Then the upgrade page's commands
run as a user copies them (the namespace, release and tag filled in): the CRDs, then `helm upgrade
--reset-then-reuse-values`, then `helm test`. Afterwards, once the controllers have rolled, they run the new chart
with the user's values, the CRDs have the new fields, the same launcher still holds the same sleeping instance, and
a scale-up wakes it: a hot start.

The controllers run as local processes of this checkout whichever chart starts them (the loopback kubelet's image
map), so this tests the chart, the CRDs and the documented procedure, and that the state left by the old release's
Pods carries over; not old controller code.
"""

import re
import shlex
import tarfile
from functools import partial
from pathlib import Path

import pytest
import yaml

from api import keys
from api.crdgen import DEFAULT_OUT_DIR as CRD_DIR
from api.version import release
from controller import pods
from e2e.chart import DUAL_PODS, POPULATOR
from e2e.cluster.cluster import LoopbackCluster, pod_is_ready
from e2e.crds import REPO, install_crds, kubectl
from e2e.dualpods_env import NO_ADMISSION_POLICIES, PROCESSES, DualPodsEnv
from e2e.fixtures import fresh_namespace
from e2e.tiny_model import ensure_tiny_model
from e2e.waiting import wait_for
from scripts.helm_chart import CHART

PREVIOUS = Path(__file__).parent / "fixture_charts" / "dualpods-0.1.0.tgz"
UPGRADE_PAGE = REPO / "docs" / "upgrade.md"
# What a platform team set at install, which the upgrade must keep.
USER_VALUES = {"dualPodsController": {"logLevel": "debug"}, "launcherPopulator": {"workers": 8}}


def documented_commands() -> list[list[str]]:
    """The first shell block of the upgrade page's sections "1. CRDs first" and "2. The chart", one command a line
    (continuations joined, comments dropped)."""
    text = UPGRADE_PAGE.read_text()
    commands = []
    for section in ("## 1. CRDs first", "## 2. The chart"):
        block = re.search(r"```sh\n(.*?)```", text[text.index(section) :], re.DOTALL)
        assert block is not None, f"{UPGRADE_PAGE}: no shell block under {section!r}"
        for line in block.group(1).replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                commands.append(words)
    return commands


def filled_in(command: list[str], namespace: str) -> list[str]:
    """A documented command with this test's namespace, the new release's tag and this checkout's paths."""
    paths = {"config/crd/": str(CRD_DIR), "charts/dualpods": str(CHART)}
    words = [paths.get(word, word) for word in command]
    words = [namespace if before == "-n" else word for before, word in zip(["", *words[:-1]], words, strict=True)]
    return [word.replace("image.tag=NEW", f"image.tag={release()}") for word in words]


def test_the_documented_commands_are_the_crds_then_the_chart() -> None:
    upgrade = next(words for words in documented_commands() if words[:2] == ["helm", "upgrade"])
    assert filled_in(upgrade, "team-a")[2:6] == ["dualpods", str(CHART), "-n", "team-a"]
    assert [words[:2] for words in documented_commands()] == [
        ["kubectl", "apply"],
        ["kubectl", "wait"],
        ["helm", "upgrade"],
        ["helm", "test"],
    ]


async def test_an_upgrade_from_the_previous_release_keeps_the_sleepers_and_the_users_values(
    cluster: LoopbackCluster, tmp_path_factory: pytest.TempPathFactory
) -> None:
    work_dir = tmp_path_factory.mktemp("upgrade")
    values = work_dir / "values.yaml"
    values.write_text(yaml.safe_dump(USER_VALUES))
    previous_crds = work_dir / "previous-crds"
    _unpack_crds(previous_crds)
    node = (await cluster.kubelet.nodes())[0]
    async with await cluster.api_client() as api, fresh_namespace(api, "upgrade") as namespace:
        env = DualPodsEnv(cluster, api, namespace, work_dir, PROCESSES)
        try:
            await kubectl(cluster, "apply", "--server-side", "--force-conflicts", "-f", str(previous_crds))
            await env.setup()
            # Its CRDs are applied above, as a cluster's first release installs them (the session's cluster has
            # this checkout's already, which Helm would not replace).
            await env.controllers.helm("install", env.controllers.release, str(PREVIOUS), "-f", str(values),
                                       "--skip-crds", f"--set={NO_ADMISSION_POLICIES}")  # fmt: skip
            for component in (DUAL_PODS, POPULATOR):
                await env.controllers.wait_running(component)
            before = {c: {p.metadata.name for p in await env.controllers.pods(c)} for c in (DUAL_PODS, POPULATOR)}

            await env.create_launcher_config("lc", max_instances=2, launcher_args=[])
            options = f"--model {ensure_tiny_model(seed=1)} --served-model-name isc --max-model-len 256"
            await env.create_isc("isc", "lc", port=8005, options=options)
            gpu = sorted(node.gpus)[0]
            await env.create_requesters("requesters", "isc", node=node.name, gpu=gpu)
            served = await env.ready_requester("requesters", within=300)
            launcher = await env.launcher_of(served)
            instance = pods.annotations(launcher)[keys.INSTANCE_ID_ANNOTATION]
            await env.create_population_policy("keep-one", "lc", count=1)  # the launcher outlives its requester
            await env.scale("requesters", 0)
            await env.wait_gone("requesters")
            await env.wait_launchers_unbound(within=60)

            for command in documented_commands():
                words = filled_in(command, namespace)
                if words[0] == "kubectl":
                    await kubectl(cluster, *words[1:])
                else:
                    await env.controllers.helm(*words[1:])

            listing = await env.controllers.helm("list", "-o", "yaml")
            (installed,) = yaml.safe_load(listing)
            assert (installed["chart"], installed["app_version"]) == (f"dualpods-{release()}", release())
            for component, old in before.items():
                await wait_for(partial(rolled, env, component, old), what=f"{component} rolled", within=120)
            dual_pods = (await env.controllers.pods(DUAL_PODS))[0].spec.containers[0]
            assert dual_pods.image.endswith(f":{release()}")
            assert "--log-level=debug" in dual_pods.args, "the user's values came through"
            schema = await kubectl(cluster, "get", "crd", "inferenceserverconfigs.fma.llm-d.ai", "-o", "json")
            assert "sleepingInstances" in schema, "the new CRDs were applied"

            launcher_now = await env.pod(pods.name(launcher))
            assert pods.uid(launcher_now) == pods.uid(launcher), "the launcher came through the upgrade"
            sleeping = [i["instance_id"] for i in await env.sleepers(launcher_now)]
            assert sleeping == [instance], "its instance is still asleep"

            async def counted() -> bool:
                isc = await kubectl(cluster, "get", "isc", "isc", "-n", namespace, "-o", "jsonpath={.status}")
                return '"sleepingInstances":1' in isc

            await wait_for(counted, what="the new controller to count the sleeper in the ISC's status", within=30)
            await env.scale("requesters", 1)
            woken = await env.ready_requester("requesters", within=60)
            bound = await env.launcher_of(woken)
            assert (pods.uid(bound), pods.annotations(bound)[keys.INSTANCE_ID_ANNOTATION]) == (
                pods.uid(launcher),
                instance,
            ), "a hot start on the launcher from before the upgrade"
        finally:
            await env.teardown()
            await install_crds(cluster, api)  # this checkout's CRDs for the tests after this one


async def rolled(env: DualPodsEnv, component: str, old: set[str]) -> bool:
    """The rolling update is over, as `kubectl rollout status` would say: a new Pod Ready, none of the old left."""
    found = await env.controllers.pods(component)
    names = {p.metadata.name for p in found}
    return names.isdisjoint(old) and any(pod_is_ready(p) for p in found)


def _unpack_crds(into: Path) -> None:
    """The previous release's CRDs, as its packaged chart ships them."""
    into.mkdir()
    with tarfile.open(PREVIOUS) as chart:
        for member in chart.getmembers():
            if member.name.startswith("dualpods/charts/crds/crds/") and member.isfile():
                extracted = chart.extractfile(member)
                assert extracted is not None
                (into / Path(member.name).name).write_bytes(extracted.read())
