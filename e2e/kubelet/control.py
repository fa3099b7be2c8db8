"""A small HTTP endpoint on 127.0.0.1 through which tests and the cluster CLI steer a running kubelet.

    GET    /nodes                 -> {"nodes": [{"name", "hostIP", "gpus": {uuid: index}}]}
    PUT    /nodes/{name}          body {"gpus": 2, "gpuMode": "dra"} (optional) -> add a Node (201), 409 if it exists
    DELETE /nodes/{name}          -> lose the Node (its processes die, its Node object is deleted)
    PUT    /gpu-map/{namespace}   -> publish the gpu-map ConfigMap there and keep it current
Its URL is written to the kubelet's `control-url` file once it listens.
"""

from pathlib import Path
from typing import Protocol

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from e2e.kubelet.config import GpuMode


def announce_url(path: Path, port: int) -> None:
    """Write where a control endpoint listens for the process that waits for the file: whole, or not at all (a
    reader that saw the file half written took an empty URL for the kubelet's, on a busy machine)."""
    partial = path.with_name(f".{path.name}.partial")
    partial.write_text(f"http://127.0.0.1:{port}\n")
    partial.replace(path)


class AddNodeBody(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    gpus: int = Field(default=2, ge=0)
    gpu_mode: GpuMode = Field(default="device-plugin", alias="gpuMode")


class NodeInfo(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    name: str
    host_ip: str = Field(alias="hostIP")
    gpus: dict[str, int]


class NotFoundError(KeyError):
    """No such node."""


class ConflictError(ValueError):
    """The node already exists."""


class Controllable(Protocol):
    def nodes(self) -> list[NodeInfo]: ...
    async def add_node(self, name: str, gpus: int, gpu_mode: GpuMode = "device-plugin") -> NodeInfo: ...
    async def lose_node(self, name: str) -> None: ...
    async def publish_gpu_map(self, namespace: str) -> None: ...


def _error(status: int, message: str) -> web.Response:
    return web.json_response({"error": message}, status=status)


def control_app(kubelet: Controllable) -> web.Application:
    async def list_nodes(_: web.Request) -> web.Response:
        return web.json_response({"nodes": [n.model_dump(by_alias=True) for n in kubelet.nodes()]})

    async def add_node(request: web.Request) -> web.Response:
        try:
            body = AddNodeBody.model_validate_json(await request.text() or "{}")
            info = await kubelet.add_node(request.match_info["name"], body.gpus, body.gpu_mode)
        except ValidationError as error:
            return _error(400, str(error))
        except ConflictError as error:
            return _error(409, str(error))
        return web.json_response(info.model_dump(by_alias=True), status=201)

    async def lose_node(request: web.Request) -> web.Response:
        try:
            await kubelet.lose_node(request.match_info["name"])
        except NotFoundError as error:
            return _error(404, str(error))
        return web.json_response({"lost": request.match_info["name"]})

    async def gpu_map(request: web.Request) -> web.Response:
        await kubelet.publish_gpu_map(request.match_info["namespace"])
        return web.json_response({"published": request.match_info["namespace"]})

    app = web.Application()
    app.router.add_get("/nodes", list_nodes)
    app.router.add_put("/nodes/{name}", add_node)
    app.router.add_delete("/nodes/{name}", lose_node)
    app.router.add_put("/gpu-map/{namespace}", gpu_map)
    return app
