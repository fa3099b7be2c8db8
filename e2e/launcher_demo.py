"""`make launcher-demo`: a real model swap with vLLM on the CPU, through the launcher alone.

Builds two tiny models offline, starts a launcher (which preloads vLLM once), serves model A,
then swaps A -> B -> A with sleep/wake, sending a chat request after each step and printing how
long each step took. Nothing keeps running afterwards.
"""

import json
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from e2e.cluster.ports import free_port
from e2e.launcher_process import LauncherProcess
from e2e.tiny_model import ensure_tiny_model

T = TypeVar("T")
BASE = "/v2/vllm/instances"


class Demo:
    def __init__(self, launcher: LauncherProcess) -> None:
        self.launcher = launcher
        self.ports: dict[str, int] = {}
        self.timings: list[tuple[str, float]] = []
        self.first_answers: dict[str, str] = {}

    def step(self, what: str, action: Callable[[], T]) -> T:
        started = time.monotonic()
        result = action()
        elapsed = time.monotonic() - started
        self.timings.append((what, elapsed))
        print(f"  {what:<44} {elapsed:7.2f} s")
        return result

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(
            f"{self.launcher.url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=300) as response:
            result: dict[str, Any] = json.loads(response.read())
            return result

    def create(self, name: str, model: Path) -> None:
        port = free_port()
        self.ports[name] = port
        options = f"--model {model} --served-model-name {name} --port {port} --max-model-len 256"
        self.call("PUT", f"{BASE}/{name}", {"options": options})
        while not self.call("GET", f"{BASE}/{name}")["ready"]:
            time.sleep(0.05)

    def chat(self, name: str) -> str:
        body = {
            "model": name,
            "messages": [{"role": "user", "content": "Say hello"}],
            "max_tokens": 12,
            "temperature": 0,
        }
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.ports[name]}/v1/chat/completions",
            data=json.dumps(body).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            answer: str = json.loads(response.read())["choices"][0]["message"]["content"]
        return answer

    def ask(self, name: str) -> None:
        answer = self.step(f"chat request to {name}", lambda: self.chat(name))
        first = self.first_answers.setdefault(name, answer)
        same = "" if first is answer else f"  same as before the swaps: {'yes' if answer == first else 'NO'}"
        print(f"      {name} answered {answer!r}{same}")

    def swap(self, from_: str, to: str) -> None:
        print(f"\nswap {from_} -> {to}")
        self.step(f"sleep {from_} (level 1)", lambda: self.call("POST", f"{BASE}/{from_}/sleep?level=1"))
        self.step(f"wake {to}", lambda: self.call("POST", f"{BASE}/{to}/wake_up"))
        self.ask(to)


def main() -> None:
    print("dualpods demo: fast model swapping with vLLM (CPU) through the launcher\n")
    print("building two tiny random-weight Llama models offline (their answers are gibberish)")
    model_a = ensure_tiny_model(seed=1)
    model_b = ensure_tiny_model(seed=2)
    with tempfile.TemporaryDirectory(prefix="dualpods-demo-") as tmp:
        launcher = LauncherProcess(Path(tmp) / "launcher", ["--mock-gpus", "1"])
        demo = Demo(launcher)
        print("\nstarting the launcher (it imports vLLM once, before any model is asked for)")
        demo.step("launcher start, vLLM preloaded", launcher.start)
        try:
            print("\ncold path: fork a vLLM server per model from the preloaded launcher")
            demo.step("fork model-a -> healthy", lambda: demo.create("model-a", model_a))
            demo.ask("model-a")
            demo.step("sleep model-a (level 1)", lambda: demo.call("POST", f"{BASE}/model-a/sleep?level=1"))
            demo.step("fork model-b -> healthy", lambda: demo.create("model-b", model_b))
            demo.ask("model-b")
            demo.swap("model-b", "model-a")
            demo.swap("model-a", "model-b")
        finally:
            survivors = launcher.stop()
    print("\nsummary")
    for what, elapsed in demo.timings:
        print(f"  {what:<44} {elapsed:7.2f} s")
    print(f"\nlauncher stopped; processes left behind: {len(survivors)}")
    print(
        "on a CPU, vLLM's sleep pauses the engine but frees no memory (sleep mode needs a GPU); "
        "the swap protocol is the same on a GPU, where waking copies the weights back to it."
    )
    if survivors:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
