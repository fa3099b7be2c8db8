"""Model swaps as a user sees them, whichever controllers, launcher and requester serve them: for the e2e that mix
FMA's components with ours and move a namespace between the two.

One requester set, pinned to one GPU, is pointed at a model and scaled up; once its requester is Ready and bound,
the model answers a chat on the instance the requester was bound to (neither FMA's controller nor FMA's requester at
its current release set up a requester's proxy, so the instance is asked directly). Whether a swap woke a sleeping
server or made a new one is read from the server itself: its process start time, from its Prometheus metrics, is
the same after a wake and later after a new start.
"""

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp

from api import keys
from e2e.actuation import release
from e2e.dualpods_env import DualPodsEnv, Obj
from e2e.fma_release import FMA_VERSION
from e2e.tiny_model import ensure_tiny_model
from e2e.waiting import wait_for

# A correctness bound, not a goal (bench/vs_fma.py measures): on a quiet machine a cold start (a launcher preloading
# vLLM, then an instance loading a tiny model) is Ready in 20-60 s, a warm one in 2-7 s and a hot one in 1-6 s (FMA's
# controller polls on a 5 s period); `make test`'s three workers beside the image build have made them 3-4x slower,
# and a launcher killed by FMA's liveness probe during its preload starts again (docs/fma-compatibility.md).
READY_S = 600
FMA_LAUNCHER = f"ghcr.io/llm-d-incubation/llm-d-fast-model-actuation/launcher:{FMA_VERSION}"
ASLEEP_S = 60  # FMA's controller puts an instance to sleep within one 5 s poll of the unbinding


# What FMA's launcher needs in an ISC to serve vLLM on a CPU (ours adds the like itself, docs/fma-compatibility.md):
# CPU flags; the dev-mode routes for sleep and wake; the engine in the server's process on loopback only.
FMA_LAUNCHER_OPTIONS = "--dtype float32 --enforce-eager --kv-cache-memory-bytes 67108864"
FMA_LAUNCHER_ENV = {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_HOST_IP": "127.0.0.1"}


async def create_models(
    env: DualPodsEnv, ports: dict[str, int], node: str, max_instances: int, fma_launcher: bool = False
) -> None:
    """LauncherConfig `lc` (our launcher, its template as FMA's e2e writes it; `fma_launcher`: FMA's own, with FMA's
    command), one launcher kept on `node`, and an ISC per entry of `ports` serving a tiny vLLM model of its own on
    that port. FMA's launcher passes no `--host` to vLLM, so its instances bind all addresses: give it free ports."""
    if fma_launcher:
        await env.create_launcher_config(
            "lc", max_instances=max_instances, image=FMA_LAUNCHER, restricted=False, command=["python3", "launcher.py"],
            launcher_args=["--mock-gpus", "--host", "$(POD_IP)", "--port", str(keys.LAUNCHER_PORT)],
        )  # fmt: skip
    else:
        await env.create_launcher_config("lc", max_instances=max_instances, launcher_args=[], restricted=False)
    await env.create_population_policy(
        "keep", "lc", count=1, selector={"labelSelector": {"matchLabels": {"kubernetes.io/hostname": node}}}
    )
    for seed, (isc, port) in enumerate(ports.items(), start=1):
        options = f"--model {ensure_tiny_model(seed)} --served-model-name {isc} --max-model-len 256"
        if fma_launcher:
            await env.create_isc(isc, "lc", port=port, options=f"{options} {FMA_LAUNCHER_OPTIONS}",
                                 env_vars=FMA_LAUNCHER_ENV)  # fmt: skip
        else:
            await env.create_isc(isc, "lc", port=port, options=options)


@dataclass
class Swaps:
    """Serving one requester set, model after model; `controller_log` says what the controllers did when it fails."""

    env: DualPodsEnv
    replica_set: str
    ports: dict[str, int]  # ISC -> the port its instances serve on
    controller_log: Callable[[], str]

    async def serve(self, isc: str) -> Obj:
        """Point the set at `isc` and scale it to 1; once its requester is Ready and bound (its accelerators
        recorded), the model answers on the bound launcher's instance. Returns the launcher."""
        await self.env.set_requester_isc(self.replica_set, isc)
        started = time.monotonic()
        await self.env.scale(self.replica_set, 1)
        try:
            requester = await self.env.ready_requester(self.replica_set, within=READY_S)
        except TimeoutError as error:
            raise TimeoutError(f"{error}\n{self.controller_log()}") from None
        print(f"{isc}: requester Ready {time.monotonic() - started:.1f} s after the scale-up")
        launcher = await self.env.launcher_of(requester)
        assert requester["metadata"]["annotations"].get(keys.ACCELERATORS_ANNOTATION), "no accelerators recorded"
        assert await chat(launcher, self.ports[isc], isc)
        return launcher

    async def release(self, launcher: Obj, isc: str) -> None:
        """Scale the set to 0; the model's instance is put to sleep."""
        await release(self.env, self.replica_set)
        port = self.ports[isc]
        await wait_for(lambda: is_sleeping(launcher, port), what=f"{isc} asleep", within=ASLEEP_S)


async def _call(launcher: Obj, port: int, method: str, path: str, body: Obj | None = None) -> Any:
    url = f"http://{launcher['status']['podIP']}:{port}{path}"
    async with aiohttp.ClientSession() as http, http.request(method, url, json=body) as response:
        assert response.status == 200, f"{method} {url}: {response.status} {await response.text()}"
        return await response.json() if response.content_type == "application/json" else await response.text()


async def open_listing(launcher: Obj) -> dict[str, Any]:
    """The launcher's instances, asked without a token, as FMA's controller asks (its launchers have none)."""
    listing: dict[str, Any] = await _call(launcher, keys.LAUNCHER_PORT, "GET", "/v2/vllm/instances")
    return listing


async def chat(launcher: Obj, port: int, model: str) -> str:
    """A short greedy chat with the model server on `port`; the answer's text."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0}
    reply = await _call(launcher, port, "POST", "/v1/chat/completions", body)
    return str(reply["choices"][0]["message"]["content"])


async def is_sleeping(launcher: Obj, port: int) -> bool:
    """What vLLM's own endpoint on the instance's port says."""
    return bool((await _call(launcher, port, "GET", "/is_sleeping"))["is_sleeping"])


async def process_start(launcher: Obj, port: int) -> float:
    """When the model server on `port` started, from its `process_start_time_seconds`."""
    text = await _call(launcher, port, "GET", "/metrics")
    [line] = [line for line in text.splitlines() if line.startswith("process_start_time_seconds ")]
    return float(line.split()[1])
