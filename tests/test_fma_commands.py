"""FMA's commands run dualpods' launcher: `python3 launcher.py ...` and `/app/launcher.py ...` in the directory
that `python3 -m launcher.fma_compat` writes, with FMA's PYTHONPATH, and the notifier's signature is FMA's.

The launcher and notifier under a real API server are in e2e/test_fma_launcher_pod.py.
"""

import contextlib
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from kubernetes_asyncio.client.exceptions import ApiException

from e2e.cluster.ports import free_port
from e2e.launcher_process import offline_environment, wait_healthy
from launcher import fma_compat
from launcher.pod_notifier import failure, signature

FMA_INDEX_NAME = "Multi-Instance vLLM Management API"


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    """An image's /app, as the launcher images make it."""
    directory = tmp_path / "app"
    result = subprocess.run([sys.executable, "-m", "launcher.fma_compat", str(directory)], capture_output=True,
                            text=True, check=True, timeout=60)  # fmt: skip
    assert sorted(p.name for p in directory.iterdir()) == ["launcher.py", "launcher_pod_notifier.py"], result.stdout
    return directory


@contextlib.contextmanager
def start(app_dir: Path, argv: list[str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    env = {**offline_environment(app_dir), "PYTHONPATH": str(app_dir), "LAUNCHER_STAND_IN": "true"}
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"  # `python3` is the one with dualpods
    log = (app_dir / f"launcher-{port}.log").open("wb")
    process = subprocess.Popen(argv, cwd=app_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_healthy(f"http://127.0.0.1:{port}/health", lambda: process.poll() is None, 120,
                     lambda: (app_dir / f"launcher-{port}.log").read_text())  # fmt: skip
        yield process
    finally:
        process.terminate()
        assert process.wait(30) == 0
        log.close()


@pytest.mark.parametrize(
    "command",
    [
        # FMA's kind e2e (test/e2e/mkobjs.sh), and its OpenShift one (mkobjs-openshift.sh), with a loopback host.
        ["python3", "launcher.py", "--mock-gpus", "--host", "127.0.0.1", "--port", "{port}", "--log-level", "info"],
        ["{app}/launcher.py", "--host=127.0.0.1", "--log-level=info", "--port={port}", "--mock-gpus"],
    ],
    ids=["python3 launcher.py", "/app/launcher.py"],
)
def test_fmas_launcher_command_runs_dualpods_launcher(app_dir: Path, command: list[str]) -> None:
    port = free_port()
    argv = [part.format(port=port, app=app_dir) for part in command]
    with start(app_dir, argv, port):
        url = f"http://127.0.0.1:{port}"
        index = requests.get(f"{url}/", timeout=5).json()
        assert (index["name"], index["version"]) == (FMA_INDEX_NAME, "2.0")
        assert "sleep_instance" in index["endpoints"]  # dualpods' launcher, additions and all
        assert requests.get(f"{url}/v2/vllm/instances", timeout=5).status_code == 200  # FMA's readiness probe
        # FMA's --mock-gpus: GPU-0..GPU-7
        body = {"options": f"--model tiny --port {free_port()}", "gpu_uuids": ["GPU-7"]}
        created = requests.put(f"{url}/v2/vllm/instances/fma", json=body, timeout=30)
        assert created.status_code == 201, created.text
        assert created.json()["env_vars"] == {"CUDA_VISIBLE_DEVICES": "7"}


def test_the_entry_points_take_their_directory_off_the_path(app_dir: Path) -> None:
    """/app first on sys.path (FMA's PYTHONPATH and the script's own directory) must not shadow the package."""
    notifier = app_dir / fma_compat.NOTIFIER_SCRIPT
    env = {**os.environ, "PYTHONPATH": str(app_dir)}
    env.pop("POD_NAME", None)
    result = subprocess.run([sys.executable, str(notifier)], cwd=app_dir, env=env, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert result.returncode == 1
    assert "missing required environment variable POD_NAME" in result.stderr


def test_the_signature_is_fmas() -> None:
    """FMA's launcher_pod_notifier.py: sha256 of json.dumps(sorted [(id, status)], separators=(",", ":"))."""
    listing = {
        "revision": 7,
        "instances": [
            {"instance_id": "b", "status": "stopped", "options": "--model x"},
            {"instance_id": "a", "status": "running", "ready": True},
            {"instance_id": "é", "status": "running"},
        ],
    }
    blob = b'[["a","running"],["b","stopped"],["\\u00e9","running"]]'
    assert signature(listing) == hashlib.sha256(blob).hexdigest()
    assert signature({"revision": 0, "instances": []}) == hashlib.sha256(b"[]").hexdigest()
    with pytest.raises(ValueError, match="instances must be a list"):
        signature({"instances": {}})


def test_the_images_entry_points_are_what_the_package_writes() -> None:
    """images/fma-app/ (which the loopback kubelet mounts at a launcher image's /app) is the package's output."""
    committed = Path(__file__).resolve().parents[1] / "images" / "fma-app"
    for name in fma_compat.ENTRY_POINTS:
        path = committed / name
        assert path.read_text() == fma_compat.entry_point(name), f"run: python3 -m launcher.fma_compat {committed}"
        assert os.access(path, os.X_OK)


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-c", "import launcher.fma_compat; print(launcher.__file__)"], f"launcher{os.sep}__init__.py"),
        (["-m", "launcher", "--help"], "--fma-only"),
    ],
    ids=["import launcher", "python -m launcher"],
)
def test_launcher_py_never_shadows_the_package(app_dir: Path, argv: list[str], expected: str) -> None:
    """In the images' working directory /app, with FMA's PYTHONPATH=/app, `launcher` is still the package (the
    images' own entrypoint is `python -m launcher`)."""
    env = {**os.environ, "PYTHONPATH": str(app_dir)}
    result = subprocess.run([sys.executable, *argv], cwd=app_dir, env=env, capture_output=True, text=True,
                            timeout=60)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert expected in result.stdout, result.stdout


def test_a_notifier_failure_says_what_the_api_server_refused() -> None:
    """A launcher Pod's ServiceAccount without the right to patch its Pod: the warning names the refusal."""
    body = json.dumps({"kind": "Status", "message": 'pods "launcher-x" is forbidden: cannot patch', "code": 403})
    refused = ApiException(status=403, reason="Forbidden")
    refused.body = body.encode()  # as the client keeps it
    assert failure(refused) == 'the API server answered 403 Forbidden: pods "launcher-x" is forbidden: cannot patch'
    assert failure(ConnectionRefusedError(111, "refused")) == "ConnectionRefusedError(111, 'refused')"
