"""Command line of the loopback cluster (`make cluster-up` / `make cluster-down` call it)."""

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import get_args

import yaml
from pydantic import TypeAdapter, ValidationError

from e2e.cluster.binaries import MissingBinaryError
from e2e.cluster.cluster import LoopbackCluster, default_nodes
from e2e.cluster.readiness import StartupError
from e2e.kubelet.config import GpuMode, NodeConfig
from e2e.kubelet.control_client import ControlError

# Preferred ports for a hand-started cluster (any free port is used when these are taken).
DEFAULT_APISERVER_PORT = 26443
DEFAULT_ETCD_PORT = 22379
GPU_MODE_HELP = "how GPUs reach Pods: NVIDIA's device plugin, the same through CDI, or NVIDIA's DRA driver"


def _nodes(args: argparse.Namespace) -> list[NodeConfig]:
    if args.node_config is None:
        return default_nodes(args.nodes, args.gpus_per_node, args.gpu_mode)
    try:
        return TypeAdapter(list[NodeConfig]).validate_python(yaml.safe_load(args.node_config.read_text()))
    except (OSError, yaml.YAMLError, ValidationError) as error:
        raise SystemExit(f"bad --node-config {args.node_config}: {error}") from None


async def _run(args: argparse.Namespace) -> int:
    cluster = LoopbackCluster(args.state_dir)
    if args.command == "up":
        if cluster.is_up():
            print(f"already up; kubeconfig: {cluster.kubeconfig}")
            return 0
        timings = await cluster.up(
            _nodes(args), apiserver_port=args.apiserver_port, etcd_port=DEFAULT_ETCD_PORT, simulated=args.simulated
        )
        state = cluster.state()
        steps = ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())
        print(f"loopback cluster up at {state.apiserver_url} ({steps})\nkubeconfig: {state.kubeconfig}")
    elif args.command == "down":
        cluster.down()
        print(f"loopback cluster in {cluster.state_dir} is down")
    elif not cluster.is_up():
        print(f"no loopback cluster is up in {cluster.state_dir}", file=sys.stderr)
        return 1
    elif args.command == "status":
        print(json.dumps({**cluster.state().model_dump(), "pids": cluster.pids()}, indent=2))
    elif args.command == "lose-node":
        await cluster.kubelet.lose_node(args.name)
    elif args.command == "add-node":
        node = await cluster.kubelet.add_node(args.name, args.gpus, args.gpu_mode)
        print(node.model_dump_json(by_alias=True))
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m e2e.cluster", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="start the cluster and wait until its Nodes are Ready")
    up.add_argument("--nodes", type=int, default=2, help="number of GPU Nodes (default 2)")
    up.add_argument("--gpus-per-node", type=int, default=2)
    up.add_argument("--node-config", type=Path, help="YAML list of {name, gpus, gpuMode, cpu, memory, pods}")
    up.add_argument("--gpu-mode", choices=get_args(GpuMode), default="device-plugin", help=GPU_MODE_HELP)
    up.add_argument("--apiserver-port", type=int, default=DEFAULT_APISERVER_PORT)
    up.add_argument(
        "--simulated",
        action="store_true",
        help="KWOK-like Nodes: requester and launcher Pods served by simulation processes per role (e2e/simulation)",
    )
    commands.add_parser("down", help="stop everything and remove the state directory")
    commands.add_parser("status", help="print the API server URL, kubeconfig and PIDs")
    lose = commands.add_parser("lose-node", help="kill a Node's processes and delete the Node")
    lose.add_argument("name")
    add = commands.add_parser("add-node", help="register another GPU Node")
    add.add_argument("name")
    add.add_argument("--gpus", type=int, default=2)
    add.add_argument("--gpu-mode", choices=get_args(GpuMode), default="device-plugin", help=GPU_MODE_HELP)
    for sub in commands.choices.values():
        sub.add_argument("--state-dir", type=Path, default=Path(".cluster"))
    args = parser.parse_args()
    try:
        sys.exit(asyncio.run(_run(args)))
    except (StartupError, ControlError, MissingBinaryError) as error:
        sys.exit(f"error: {error}")


if __name__ == "__main__":
    main()
