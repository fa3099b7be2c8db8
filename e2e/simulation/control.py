"""The simulation process's control API (see `protocol.py`): the kubelet starts and stops containers of
one role here, and benchmarks read the report."""

import asyncio
import logging
import shlex
import shutil
from pathlib import Path

from aiohttp import web
from pydantic import ValidationError

from e2e.simulation.container import SimulatedContainer, StartFailure
from e2e.simulation.launcher import LauncherContainer
from e2e.simulation.notifier import NotifierContainer, is_notifier
from e2e.simulation.protocol import KILLED, ContainerSpec, Report, Role, Started, Stopped
from e2e.simulation.requester import RequesterContainer

log = logging.getLogger(__name__)

# What each role runs by its image's entrypoint (a container that gives no `command`).
ENTRYPOINTS: dict[Role, type[RequesterContainer] | type[LauncherContainer]] = {
    "requester": RequesterContainer,
    "launcher": LauncherContainer,
}


class UnknownCommand(SimulatedContainer):
    """A `command` the simulation has no program for: it exits at once, as a missing executable would."""

    async def start(self) -> None:
        argv = shlex.join([*(self.spec.command or []), *self.spec.args])
        raise StartFailure(127, f"a simulated {self.spec.role} container cannot run {argv}")

    async def stop(self, grace_seconds: float) -> int:
        return 0

    async def kill(self) -> None:
        pass


def program(spec: ContainerSpec) -> type[SimulatedContainer]:
    """The simulated program a container runs: its image's entrypoint, or, in the launcher's image, FMA's notifier
    sidecar (FMA's controllers add it to every launcher Pod), chosen by its command."""
    if spec.command is None:
        return ENTRYPOINTS[spec.role]
    if spec.role == "launcher" and is_notifier(spec):
        return NotifierContainer
    return UnknownCommand


class Simulation:
    """The running containers of one role."""

    def __init__(self, role: Role, state_dir: Path) -> None:
        self.role = role
        self.state_dir = state_dir
        self.containers: dict[str, SimulatedContainer] = {}

    async def start(self, spec: ContainerSpec) -> Started:
        if spec.role != self.role:
            raise web.HTTPBadRequest(text=f"this simulation runs {self.role} containers, not {spec.role}")
        if spec.id in self.containers:
            raise web.HTTPConflict(text=f"container {spec.id} is running")
        container = program(spec)(spec, self.state_dir / spec.id)
        try:
            await container.start()
        except StartFailure as failure:
            container.log(str(failure))
            log.info("%s/%s %s exited at start with %d", spec.namespace, spec.pod, spec.container, failure.exit_code)
            return Started(exit_code=failure.exit_code)
        except Exception as err:  # a bug of the simulation: this container fails, the others go on
            log.exception("%s/%s %s could not be simulated", spec.namespace, spec.pod, spec.container)
            container.log(f"the simulation cannot run this container: {err!r}")
            await container.kill()
            return Started(exit_code=1)
        self.containers[spec.id] = container
        return Started()

    def _take(self, container_id: str) -> SimulatedContainer:
        container = self.containers.pop(container_id, None)
        if container is None:
            raise web.HTTPNotFound(text=f"no running container {container_id}")
        return container

    async def stop(self, container_id: str, grace_seconds: float) -> Stopped:
        container = self._take(container_id)
        try:
            return Stopped(exit_code=await container.stop(grace_seconds))
        finally:
            self._forget(container)

    async def kill(self, container_id: str) -> Stopped:
        container = self._take(container_id)
        try:
            await container.kill()
        finally:
            self._forget(container)
        return Stopped(exit_code=KILLED)

    def _forget(self, container: SimulatedContainer) -> None:
        shutil.rmtree(container.state_dir, ignore_errors=True)

    async def kill_all(self) -> None:
        await asyncio.gather(*(self.kill(i) for i in list(self.containers)), return_exceptions=True)

    def report(self, changed_since: float | None = None) -> Report:
        """What the containers hold; with `changed_since`, only the requesters whose readiness changed since then
        (a benchmark polling a thousand requesters each second had this process build and send all of them, a
        fifth of its CPU, for the few that changed)."""
        running = list(self.containers.values())
        requesters = [c for c in running if isinstance(c, RequesterContainer)]
        if changed_since is not None:
            requesters = [c for c in requesters if c.readiness.changed_since(changed_since)]
        return Report(
            role=self.role,
            requesters=[c.report() for c in requesters],
            launchers=[c.report() for c in running if isinstance(c, LauncherContainer)],
        )


SIMULATION = web.AppKey("simulation", Simulation)


def _json(body: Started | Stopped | Report, status: int = 200) -> web.Response:
    return web.Response(text=body.model_dump_json(), status=status, content_type="application/json")


def control_app(simulation: Simulation) -> web.Application:
    async def start(request: web.Request) -> web.Response:
        try:
            spec = ContainerSpec.model_validate_json(await request.read())
        except ValidationError as err:
            raise web.HTTPBadRequest(text=str(err)) from None
        return _json(await simulation.start(spec), status=201)

    async def stop(request: web.Request) -> web.Response:
        try:
            grace = float(request.query.get("grace", "30"))
        except ValueError:
            raise web.HTTPBadRequest(text=f"grace={request.query['grace']!r} is not a number of seconds") from None
        return _json(await simulation.stop(request.match_info["id"], max(grace, 0.0)))

    async def kill(request: web.Request) -> web.Response:
        return _json(await simulation.kill(request.match_info["id"]))

    async def report(request: web.Request) -> web.Response:
        since = request.query.get("changed_since")
        try:
            return _json(simulation.report(float(since) if since is not None else None))
        except ValueError:
            raise web.HTTPBadRequest(text=f"changed_since is not a number of seconds: {since!r}") from None

    app = web.Application(client_max_size=16 * 1024 * 1024)
    app[SIMULATION] = simulation
    app.router.add_post("/containers", start)
    app.router.add_post("/containers/{id}/stop", stop)
    app.router.add_post("/containers/{id}/kill", kill)
    app.router.add_get("/report", report)
    return app
