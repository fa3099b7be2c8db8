"""The images a platform team installs, built by `make images` and run as a user would (issue 9).

First each image alone, with podman and the run flags this machine needs: the controller and requester
answer `--help` as non-root users; the CPU launcher answers /health and forks a real vLLM inside its
container that answers an OpenAI chat about a tiny model mounted read-only; the GPU launcher's Dockerfile,
built on the stand-in for vllm/vllm-openai, starts and preloads both runtimes; no image holds the tests,
a compiler or a pip cache. Then the three images in the loopback cluster (the kubelet's OCI runtime): the
chart installed with the controller image, the cold -> warm -> hot swap with vLLM inside the launcher
image, and chats through the requester image's proxy.
"""

import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from e2e.actuation import Actuation, actuate, release
from e2e.cluster.cluster import LoopbackCluster
from e2e.cluster.ports import free_port
from e2e.dualpods_env import DualPodsEnv, Obj, built_images, installed, proxy_chat
from e2e.kubelet import oci
from e2e.test_dualpods_runtimes import served_models
from e2e.tiny_model import ensure_tiny_model
from scripts.images import catalogue, tools
from scripts.images.pipeline import build_all
from scripts.images.wheelhouse import version

RUN = ["podman", "run", "--rm", "--network=host", "--pull=never", *tools.MACHINE_FLAGS]
# Last in the session (conftest.py): `make test` builds the images meanwhile, and the first test's setup waits
# for that build, which took 23 minutes cold beside three test workers.
pytestmark = [pytest.mark.images, pytest.mark.timeout(1800)]
COMPONENTS = [catalogue.CONTROLLER, catalogue.REQUESTER, catalogue.LAUNCHER_CPU, catalogue.LAUNCHER_GPU]


@pytest.fixture(scope="module")
def images() -> None:
    """Every image built and up to date (a rebuild with nothing changed takes seconds)."""
    build_all(list(catalogue.BY_NAME))


def run(
    image: catalogue.ImageSpec, *args: str, entrypoint: str | None = None, user: str | None = None
) -> subprocess.CompletedProcess[str]:
    override = [f"--entrypoint={entrypoint}"] if entrypoint else []
    override += [f"--user={user}"] if user else []
    return subprocess.run([*RUN, *override, image.reference, *args], capture_output=True, text=True, check=False)


@contextlib.contextmanager
def launcher(image: catalogue.ImageSpec, *volumes: str) -> Iterator[tuple[str, str]]:
    """The launcher image started as `podman run ... IMAGE --host 127.0.0.1 --port P`; (its URL, its name)."""
    port, name = free_port(), f"dualpods-test-launcher-{free_port()}"
    mounts = [f"--volume={volume}" for volume in volumes]
    argv = [*RUN, "--detach", f"--name={name}", *mounts, image.reference]
    subprocess.run([*argv, "--host", "127.0.0.1", "--port", str(port), "--mock-gpus", "1"], check=True,
                   capture_output=True)  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        wait_answers(f"{url}/health", within=120, diagnose=lambda: logs(name))
        yield url, name
    finally:
        subprocess.run(["podman", "rm", "--force", "--time=5", name], capture_output=True, check=False)


def logs(name: str) -> str:
    """The container's output so far (stdout and stderr together)."""
    done = subprocess.run(["podman", "logs", name], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return done.stdout[-3000:]


def call(url: str, method: str = "GET", body: dict[str, Any] | None = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return json.loads(response.read())


def call_status(url: str, method: str, body: dict[str, Any]) -> tuple[int, Any]:
    """(the HTTP status, the JSON body) of a call that may be refused."""
    try:
        return 200, call(url, method, body)
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def wait_answers(url: str, within: float, diagnose: Any = lambda: "") -> None:
    deadline = time.monotonic() + within
    while True:
        try:
            call(url)
            return
        except OSError:
            assert time.monotonic() < deadline, f"{url} did not answer in {within} s:\n{diagnose()}"
            time.sleep(0.2)


@pytest.mark.parametrize("image", [catalogue.CONTROLLER, catalogue.REQUESTER], ids=lambda i: i.name)
def test_controller_and_requester_answer_help_as_non_root(images: None, image: catalogue.ImageSpec) -> None:
    done = run(image, "--help")
    assert done.returncode == 0, done.stderr
    assert f"python -m {image.name}" in done.stdout
    assert run(image, "-u", entrypoint="id").stdout.strip() == "65532"


# Run inside each image (as root, to see every home): what of the checkout, compilers and pip caches it holds.
PROBE = """
import json, pathlib, shutil, subprocess
def imports(name):
    return subprocess.run(["python3", "-c", f"import {name}"], capture_output=True, text=True).stderr.strip()
caches = [str(p) for g in ("root/.cache/pip", "home/*/.cache/pip", "tmp/pip-*") for p in pathlib.Path("/").glob(g)]
print(json.dumps({"tests.standin": imports("tests.standin").splitlines()[-1], "e2e": imports("e2e").splitlines()[-1],
                  "compilers": [c for c in ("gcc", "cc", "c++", "clang") if shutil.which(c)], "pip caches": caches}))
"""


@pytest.mark.parametrize("image", COMPONENTS, ids=lambda i: i.name)
def test_images_hold_the_wheel_and_nothing_of_the_checkout(images: None, image: catalogue.ImageSpec) -> None:
    """No tests, no loopback harness, no compiler, no pip cache; non-root; labelled as OCI asks."""
    done = run(image, "-c", PROBE, entrypoint="python3", user="0")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {
        "tests.standin": "ModuleNotFoundError: No module named 'tests'",
        "e2e": "ModuleNotFoundError: No module named 'e2e'",
        "compilers": [],
        "pip caches": [],
    }
    found = tools.inspect(image.reference)
    assert found is not None
    assert found["Config"]["User"] == "65532"
    labels = found["Labels"]
    assert labels["org.opencontainers.image.version"] == version()
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert "org.opencontainers.image.source" in labels


def test_the_cpu_launcher_image_forks_vllm_that_answers_a_chat(images: None, tmp_path: Path) -> None:
    """Before that, a model whose weights only root may read (as safetensors writes them, mode 0600) is refused
    before any fork, naming the file and the image's user, for either runtime."""
    model = ensure_tiny_model(seed=1)
    private = tmp_path / "private"
    shutil.copytree(model, private)
    private.chmod(0o755)
    (private / "model.safetensors").chmod(0o600)
    with launcher(catalogue.LAUNCHER_CPU, f"{model}:/models/tiny:ro", f"{private}:/models/private:ro") as (url, name):
        assert "preloaded transformers, vllm in" in logs(name)
        for runtime in ("vllm", "transformers"):
            create = {"options": f"--model /models/private --port {free_port()}", "runtime": runtime}
            status, refused = call_status(f"{url}/v2/vllm/instances", "POST", create)
            assert status == 400, refused
            assert refused["reason"] == "InvalidOptions", refused
            assert "/models/private/model.safetensors" in refused["detail"], refused
            assert "dualpods (uid 65532, gid 0)" in refused["detail"], refused
        assert call(f"{url}/v2/vllm/instances")["instances"] == [], "nothing was forked"

        port = free_port()
        options = f"--model /models/tiny --served-model-name tiny --port {port} --max-model-len 256"
        call(f"{url}/v2/vllm/instances/tiny", "PUT", {"options": options})
        deadline = time.monotonic() + 180
        while not (state := call(f"{url}/v2/vllm/instances/tiny"))["ready"]:
            assert state["status"] == "running", state
            assert time.monotonic() < deadline, "the instance was not ready in 180 s"
            time.sleep(0.2)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0}
        reply = call(f"http://127.0.0.1:{port}/v1/chat/completions", "POST", body)
        assert reply["choices"][0]["message"]["content"]
        inside = subprocess.run(["podman", "top", name, "user", "args"], capture_output=True, text=True, check=True)
        assert "dualpods-instance tiny" in inside.stdout, "vLLM runs in the launcher's container"
        assert "root" not in inside.stdout


def test_the_gpu_launcher_dockerfile_starts_on_vllms_image_layout(images: None) -> None:
    with launcher(catalogue.LAUNCHER_GPU) as (_, name):
        assert "preloaded transformers, vllm in" in logs(name)
    where = run(catalogue.LAUNCHER_GPU, "-c", "import launcher, vllm; print(launcher.__file__, vllm.__file__)",
                entrypoint="python3")  # fmt: skip
    launcher_file, vllm_file = where.stdout.split()
    assert Path(launcher_file).parent.parent == Path(vllm_file).parent.parent, "beside vLLM, in vLLM's Python"
    assert vllm_file.startswith("/usr/local/lib/python3"), "where vllm/vllm-openai has it"


@pytest.mark.parametrize("image", [catalogue.LAUNCHER_CPU, catalogue.LAUNCHER_GPU], ids=lambda i: i.name)
def test_the_launcher_images_answer_to_fmas_commands(images: None, image: catalogue.ImageSpec) -> None:
    """`python3 launcher.py` in the working directory, with FMA's PYTHONPATH=/app, is dualpods' launcher; the
    notifier sidecar's `python3 /app/launcher_pod_notifier.py` is FMA's notifier (it needs its Pod's name)."""
    fma_env = ["PYTHONPATH=/app", "python3"]  # through `env`, which then runs python3 (in the working directory)
    usage = run(image, *fma_env, "launcher.py", "--help", entrypoint="env")
    assert usage.returncode == 0, usage.stderr
    assert usage.stdout.startswith("usage: launcher.py"), usage.stdout
    assert "--mock-gpus" in usage.stdout
    notifier = run(image, *fma_env, "/app/launcher_pod_notifier.py", entrypoint="env")
    assert notifier.returncode == 1
    assert "missing required environment variable POD_NAME" in notifier.stderr, notifier.stderr


# ----- the three images in the loopback cluster

MODELS = {"model-a": (1, 8005), "model-b": (2, 8006)}
RS = "swap"


def runs_in_a_container(pod: Obj) -> bool:
    statuses = pod["status"].get("containerStatuses") or []
    return bool(statuses) and all(s.get("containerID", "").startswith(oci.CONTAINER_ID_SCHEME) for s in statuses)


async def swap_to(env: DualPodsEnv, isc: str, what: str, timings: dict[str, Actuation]) -> Obj:
    """Point the requester set at `isc`, scale it up, and check the served model answers through the proxy."""
    await env.set_requester_isc(RS, isc)
    timings[what] = await actuate(env, RS, within=300)
    (requester,) = await env.requesters(RS)
    assert await served_models(requester) == {isc}
    assert await proxy_chat(requester, isc)
    return requester


async def test_the_chart_with_real_images_swaps_models(
    images: None, cluster: LoopbackCluster, api: client.ApiClient, namespace: str, tmp_path: Path
) -> None:
    models = {name: ensure_tiny_model(seed) for name, (seed, _) in MODELS.items()}
    async with installed(cluster, api, namespace, tmp_path, images=built_images()) as env:
        controllers = await env.controllers.pods("dual-pods-controller")
        assert all(runs_in_a_container(api.sanitize_for_serialization(p)) for p in controllers)
        await env.create_launcher_config("lc", max_instances=2, launcher_args=[])
        for name, (_, port) in MODELS.items():
            options = f"--model {env.images.model(models[name])} --served-model-name {name} --max-model-len 256"
            await env.create_isc(name, "lc", port=port, options=options)
        node = (await cluster.kubelet.nodes())[0]
        await env.create_requesters(RS, "model-a", replicas=0, node=node.name, gpu=sorted(node.gpus)[0])

        timings: dict[str, Actuation] = {}
        requester = await swap_to(env, "model-a", "cold", timings)
        launcher_pod = await env.launcher_of(requester)
        assert runs_in_a_container(requester)
        assert runs_in_a_container(launcher_pod)
        await env.create_population_policy("keep", "lc", count=1)
        await release(env, RS)
        requester = await swap_to(env, "model-b", "warm", timings)
        assert (await env.launcher_of(requester))["metadata"]["name"] == launcher_pod["metadata"]["name"]
        await release(env, RS)
        await swap_to(env, "model-a", "hot", timings)
        instances = (await env.instances(launcher_pod))["instances"]
        assert len(instances) == 2, "model-a was woken, not forked again"
        print("\nreal images, requester start -> told ready / Pod Ready:")
        for what, actuation in timings.items():
            print(f"  {what:<5} {actuation.total:6.2f} s / {actuation.pod_ready:6.2f} s")
