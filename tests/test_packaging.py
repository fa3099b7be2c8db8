"""The wheel is the packaging boundary (issue 9): each component starts from its wheel and extra alone.

Each component's extra is installed, with nothing else, into a clean virtualenv: its dependency closure
(the same hash-pinned file its image installs, `scripts/images`) and the project's wheel built from this
checkout, with no checkout on `sys.path`. Then the component's real start-up runs there (the launcher's
preload included, the controller's and requester's `--help`), every project module its entry point can
load is imported (lazy, function-level imports included), and every third-party module they import must
be installed. A module that an extra does not bring fails here, not in a user's CrashLoopBackOff.
The closures are cached as plain package directories (`$DUALPODS_CACHE/closures/`); the wheel and the
virtualenvs are made afresh each run.
"""

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from e2e.cluster.ports import free_port
from scripts.build_cache import ensure_built
from scripts.images import catalogue, wheelhouse
from tests.imports import imported, module_file, modules_under

SHIPPED = ("api", "gocompat", "kube", "controller", "launcher", "requester", "standin", "transformers_runtime")
NOT_SHIPPED = ("tests", "e2e", "scripts", "bench")


def reachable(entry: str) -> tuple[set[str], set[str]]:
    """(project modules, third-party top-level modules) that `entry` can import, following every import."""
    project: set[str] = set()
    third_party: set[str] = set()
    pending = [entry]
    while pending:
        module = pending.pop()
        if module in project:
            continue
        top = module.split(".")[0]
        if top in sys.stdlib_module_names:
            continue
        source = module_file(module)
        if top not in SHIPPED or source is None:
            third_party.add(top)
            continue
        project.add(module)
        parents = [".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 1)]
        pending += parents + sorted(imported(module, source))
    return project, third_party


def test_shipped_code_imports_nothing_of_the_checkout() -> None:
    """Production code never imports tests/, e2e/, scripts/ or bench/: none of them is in the wheel."""
    offenders = []
    for package in SHIPPED:
        for module, source in modules_under(package):
            offenders += [
                f"{module} imports {name}" for name in imported(module, source) if name.startswith(NOT_SHIPPED)
            ]
    assert not offenders


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheelhouse.build_wheel(tmp_path_factory.mktemp("dist"))


def _pip(*args: str) -> None:
    """The test's pip, blind to the machine's pip configuration (indexes, find-links, constraints)."""
    env = {**os.environ, "PIP_CONFIG_FILE": os.devnull}
    subprocess.run([sys.executable, "-m", "pip", *args], env=env, check=True, capture_output=True)


def _dependencies(closure: str) -> Path:
    """The closure's packages installed (`--target`) into a cached directory, as its image installs them."""
    cached = wheelhouse.ensure_wheelhouse(catalogue.closures())
    requirements = cached / "closures" / f"{closure}.txt"
    key = hashlib.sha256(requirements.read_bytes()).hexdigest()[:16]
    offline = ["--quiet", "--no-index", "--find-links", str(cached / "wheels"), "--no-deps", "--require-hashes"]

    def install(out: Path) -> None:
        # uv, not the images' pip: the CPU launcher's closure is 6 GB installed (torch and NVIDIA's libraries), which
        # pip unpacks one file at a time (minutes on a cold machine; uv 55 s under load). Same packages; uv also
        # unpacks wheels' data files (intel-openmp's lib/), outside any import path.
        uv = Path(sys.executable).parent / "uv"
        env = {**os.environ, "UV_NO_CONFIG": "1", "UV_PYTHON": sys.executable}
        argv = [str(uv), "pip", "install", *offline, "--target", str(out / "site"), "-r", str(requirements)]
        subprocess.run(argv, env=env, check=True, capture_output=True)

    return ensure_built("closures", f"{closure}-{key}", install) / "site"


def clean_install(closure: str, wheel: Path, where: Path) -> Path:
    """A fresh virtualenv holding the wheel and the closure, nothing else; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(where)], check=True)
    python = where / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(subprocess.check_output([python, "-c", purelib], text=True).strip())
    (site / "dependencies.pth").write_text(f"{_dependencies(closure)}\n")
    _pip("--python", str(python), "install", "--quiet", "--no-index", "--no-deps", str(wheel))
    return python


def clean_env(home: Path) -> dict[str, str]:
    """No PYTHONPATH, no virtualenv of the checkout's; offline."""
    keep = {k: v for k, v in os.environ.items() if k in ("PATH", "LANG", "TERM")}
    return {**keep, "HOME": str(home), "TMPDIR": str(home), "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}


def run_in(python: Path, home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env(home)
    return subprocess.run([str(python), *args], cwd=home, env=env, capture_output=True, text=True, check=False)


# The probe run in the clean virtualenv: project modules are imported, third-party ones looked up.
PROBE = """
import importlib, importlib.util, json, sys
wanted = json.loads(sys.argv[1])
for name in wanted["project"]:
    importlib.import_module(name)
missing = [name for name in wanted["third_party"] if importlib.util.find_spec(name) is None]
outside = [name for name in sys.modules if name.split(".")[0] in ("tests", "e2e", "scripts", "bench")]
print(json.dumps({"missing": missing, "checkout_modules": outside}))
"""


def assert_entry_point_loads(python: Path, home: Path, entry: str) -> None:
    project, third_party = reachable(entry)
    assert not third_party & set(NOT_SHIPPED)
    wanted = json.dumps({"project": sorted(project), "third_party": sorted(third_party)})
    done = run_in(python, home, "-c", PROBE, wanted)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout) == {"missing": [], "checkout_modules": []}


@pytest.mark.parametrize(
    ("component", "entry"), [("controller", "controller.__main__"), ("requester", "requester.__main__")]
)
def test_a_component_starts_from_its_extra_alone(component: str, entry: str, wheel: Path, tmp_path: Path) -> None:
    python = clean_install(component, wheel, tmp_path / "venv")
    done = run_in(python, tmp_path, "-m", component, "--help")
    assert done.returncode == 0, done.stderr
    assert f"python -m {component}" in done.stdout
    assert run_in(python, tmp_path, "-c", "import tests").returncode != 0, "the checkout is on sys.path"
    assert_entry_point_loads(python, tmp_path, entry)


@pytest.fixture
def launcher_log(wheel: Path, tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """`python -m launcher` from dualpods[launcher-cpu] alone, up and healthy; (its python, its log so far)."""
    python = clean_install("launcher-cpu", wheel, tmp_path / "venv")
    port = free_port()
    log = tmp_path / "launcher.log"
    with log.open("wb") as out:
        argv = [str(python), "-m", "launcher", "--host", "127.0.0.1", "--port", str(port), "--mock-gpus", "1"]
        process = subprocess.Popen(argv, cwd=tmp_path, env=clean_env(tmp_path), stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 180
        while True:
            assert process.poll() is None, f"the launcher exited with {process.returncode}:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"not healthy after 180 s:\n{log.read_text()[-3000:]}"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as response:
                    if response.status == 200:
                        break
            except OSError:
                time.sleep(0.2)
        yield python, log.read_text()
    finally:
        process.terminate()
        process.wait(30)


def test_the_launcher_preloads_both_runtimes_from_its_extra_alone(
    launcher_log: tuple[Path, str], tmp_path: Path
) -> None:
    python, log = launcher_log
    assert "preloaded transformers, vllm in" in log, log
    assert "runtime needs" not in log, log
    assert_entry_point_loads(python, tmp_path, "launcher.__main__")
