"""`python -m e2e.simulation --role requester|launcher --url-file F --state-dir D`: one simulation process.

The loopback kubelet starts one or more per role on simulated Nodes and stops it with SIGTERM (every container it
still runs is then cut off, as a node's processes die with it). Its control API listens on 127.0.0.1; its
URL is written to the URL file once it listens.
"""

import argparse
import asyncio
import logging
import signal
from pathlib import Path
from typing import get_args

from aiohttp import web

from e2e.kubelet.control import announce_url
from e2e.simulation.control import Simulation, control_app
from e2e.simulation.protocol import Role
from kube.gc_thresholds import tune_for_caches


async def serve(role: Role, url_file: Path, state_dir: Path) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    simulation = Simulation(role, state_dir)
    runner = web.AppRunner(control_app(simulation), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        _announce(url_file, runner.addresses[0][1], role)
        await stop.wait()
    finally:
        await simulation.kill_all()
        await runner.cleanup()


def _announce(url_file: Path, port: int, role: Role) -> None:
    announce_url(url_file, port)
    logging.getLogger("e2e.simulation").info("simulating %s containers; control on port %d", role, port)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m e2e.simulation", description=__doc__)
    parser.add_argument("--role", choices=get_args(Role), required=True)
    parser.add_argument("--url-file", type=Path, required=True, help="where to write the control API's URL")
    parser.add_argument("--state-dir", type=Path, required=True, help="scratch space of the containers")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args()
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args.state_dir.mkdir(parents=True, exist_ok=True)
    tune_for_caches()
    asyncio.run(serve(args.role, args.url_file, args.state_dir))


if __name__ == "__main__":
    main()
