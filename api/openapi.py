"""OpenAPI 3.1 documents for our aiohttp servers, built from their route tables and pydantic's JSON Schema.

No maintained library fits aiohttp and pydantic v2 without rewriting every handler into its own view
classes (aiohttp-pydantic) or moving to marshmallow (aiohttp-apispec), so each server describes its
handlers with an `Operation` (the `documented` decorator) and `serve_openapi` adds `GET /openapi.json`
and a `GET /docs` page, both built from the routes as they are registered. A route left undescribed is
an error when the document is built, so the document cannot silently fall behind the server.
Servers whose routes are not one handler per path (the requester's proxy forwards every path) build
their document from an explicit list with `build_document`.

Request and response bodies are Python types (pydantic models, `list[str]`, ...) turned into JSON
Schema by pydantic; their named models land in `components.schemas`.
"""

import html
import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from aiohttp import web
from pydantic import BaseModel, TypeAdapter

OPENAPI_PATH: Final = "/openapi.json"
DOCS_PATH: Final = "/docs"
OPENAPI_VERSION: Final = "3.1.0"
BEARER_SCHEME: Final = "bearer"
_REF_TEMPLATE = "#/components/schemas/{model}"
_UNDOCUMENTED = frozenset({OPENAPI_PATH, DOCS_PATH})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
H = TypeVar("H", bound=Handler)


@dataclass(frozen=True)
class Content:
    """A body: a Python type pydantic can describe (JSON), or a free text/plain body (`type_` None)."""

    type_: Any = None
    media_type: str = "application/json"
    max_bytes: int | None = None  # documented as the largest body the server takes (413 beyond)


TEXT: Final = Content(media_type="text/plain")


@dataclass(frozen=True)
class Reply:
    description: str
    content: Content | None = None
    headers: dict[str, str] = field(default_factory=dict)  # name -> description


@dataclass(frozen=True)
class Operation:
    summary: str
    responses: dict[int, Reply]
    description: str = ""
    query: type[BaseModel] | None = None  # each field is a query parameter (its alias, if any, is the name)
    headers: type[BaseModel] | None = None  # each field is a request header, the same way
    body: Content | None = None
    body_required: bool = True
    bearer: bool = False  # needs `Authorization: Bearer <token>`
    tags: tuple[str, ...] = ()


_OPERATIONS: dict[Handler, Operation] = {}


def documented(operation: Operation) -> Callable[[H], H]:
    """Attach `operation` to a handler, for the server's document."""

    def register(handler: H) -> H:
        _OPERATIONS[handler] = operation
        return handler

    return register


def operation_of(handler: object) -> Operation | None:
    """The Operation a handler was documented with."""
    return _OPERATIONS.get(handler)  # type: ignore[call-overload, no-any-return]


class _Schemas:
    """JSON Schemas of types, with the named models they use collected once for `components.schemas`."""

    def __init__(self) -> None:
        self.components: dict[str, Any] = {}

    def of(self, type_: Any, mode: str) -> dict[str, Any]:
        """The schema of `type_`: a `$ref` for a model, the schema itself for other types."""
        schema: dict[str, Any] = TypeAdapter(type_).json_schema(mode=mode, ref_template=_REF_TEMPLATE)  # type: ignore[arg-type]
        for name, definition in schema.pop("$defs", {}).items():
            self._add(name, definition)
        if isinstance(type_, type) and issubclass(type_, BaseModel):
            self._add(type_.__name__, schema)
            return {"$ref": _REF_TEMPLATE.format(model=type_.__name__)}
        return schema

    def _add(self, name: str, definition: dict[str, Any]) -> None:
        known = self.components.setdefault(name, definition)
        if known != definition:
            raise ValueError(f"two different schemas are both named {name!r}")


def _parameters(operation: Operation, path: str, schemas: _Schemas) -> list[dict[str, Any]]:
    parameters = [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string"}} for name in _path_names(path)
    ]
    for where, model in (("query", operation.query), ("header", operation.headers)):
        if model is None:
            continue
        fields = TypeAdapter(model).json_schema(mode="validation", ref_template=_REF_TEMPLATE)
        required = set(fields.get("required", []))
        for name, schema in fields.get("properties", {}).items():
            parameter = {"name": name, "in": where, "required": name in required, "schema": schema}
            if "description" in schema:
                parameter["description"] = schema["description"]
            parameters.append(parameter)
    return parameters


def _path_names(path: str) -> list[str]:
    names = []
    for part in path.split("/"):
        if part.startswith("{") and part.endswith("}"):
            names.append(part[1:-1].split(":", 1)[0])
    return names


def _content(content: Content, schemas: _Schemas, mode: str) -> dict[str, Any]:
    schema = {"type": "string"} if content.type_ is None else schemas.of(content.type_, mode)
    return {content.media_type: {"schema": schema}}


def _operation(method: str, path: str, operation: Operation, schemas: _Schemas, secured: bool) -> dict[str, Any]:
    described: dict[str, Any] = {
        "summary": operation.summary,
        "operationId": f"{method.lower()}{path}".replace("/", "_").replace("{", "").replace("}", ""),
        "responses": {},
    }
    if operation.description:
        described["description"] = operation.description
    if operation.tags:
        described["tags"] = list(operation.tags)
    parameters = _parameters(operation, path, schemas)
    if parameters:
        described["parameters"] = parameters
    if operation.body is not None:
        body: dict[str, Any] = {
            "required": operation.body_required,
            "content": _content(operation.body, schemas, "validation"),
        }
        if operation.body.max_bytes is not None:
            body["description"] = f"At most {operation.body.max_bytes} bytes (413 beyond)."
        described["requestBody"] = body
    if operation.bearer and secured:
        described["security"] = [{BEARER_SCHEME: []}]
    for status, reply in sorted(operation.responses.items()):
        answer: dict[str, Any] = {"description": reply.description}
        if reply.content is not None:
            answer["content"] = _content(reply.content, schemas, "serialization")
        if reply.headers:
            answer["headers"] = {name: {"description": text, "schema": {"type": "string"}}
                                 for name, text in reply.headers.items()}  # fmt: skip
        described["responses"][str(status)] = answer
    return described


def build_document(
    title: str,
    version: str,
    operations: Iterable[tuple[str, str, Operation]],
    description: str = "",
    bearer_description: str | None = None,
) -> dict[str, Any]:
    """The document of `(method, path, operation)` triples. Operations marked `bearer` need the token only
    with a `bearer_description` (a server may run with its authentication off)."""
    schemas = _Schemas()
    listed = list(operations)
    paths: dict[str, dict[str, Any]] = {}
    for method, path, operation in listed:
        paths.setdefault(path, {})[method.lower()] = _operation(
            method, path, operation, schemas, bearer_description is not None
        )
    components: dict[str, Any] = {"schemas": dict(sorted(schemas.components.items()))}
    if bearer_description is not None and any(operation.bearer for _, _, operation in listed):
        components["securitySchemes"] = {
            BEARER_SCHEME: {"type": "http", "scheme": "bearer", "description": bearer_description}
        }
    info = {"title": title, "version": version}
    if description:
        info["description"] = description
    return {"openapi": OPENAPI_VERSION, "info": info, "paths": paths, "components": components}


def app_operations(
    app: web.Application, operations: Mapping[Handler, Operation] | None = None
) -> list[tuple[str, str, Operation]]:
    """Every route of `app` with its Operation (from `operations`, else `documented`); raises LookupError naming a
    route that has none."""
    found = []
    for route in app.router.routes():
        resource = route.resource
        if route.method == "HEAD" or resource is None or resource.canonical in _UNDOCUMENTED:
            continue
        operation = (operations or {}).get(route.handler) or _OPERATIONS.get(route.handler)
        if operation is None:
            raise LookupError(f"{route.method} {resource.canonical} has no Operation; decorate its handler")
        found.append((route.method, resource.canonical, operation))
    return found


def serve_openapi(
    app: web.Application,
    title: str,
    version: str,
    description: str = "",
    bearer_description: str | None = None,
    operations: Mapping[Handler, Operation] | None = None,
) -> None:
    """Add `GET /openapi.json` and `GET /docs` to `app`, describing every other route of it (see
    `build_document` for `bearer_description`). `operations` documents handlers that several servers share but
    describe each their own way (vLLM's inference routes: each runtime takes its own bodies)."""
    built: dict[str, Any] = {}

    def document() -> dict[str, Any]:
        if not built:
            listed = app_operations(app, operations)
            built.update(build_document(title, version, listed, description, bearer_description))
        return built

    async def openapi_json(request: web.Request) -> web.Response:
        return web.json_response(document())

    async def docs(request: web.Request) -> web.Response:
        return web.Response(text=render_docs(document()), content_type="text/html")

    app.router.add_get(OPENAPI_PATH, openapi_json)
    app.router.add_get(DOCS_PATH, docs)


def render_docs(document: dict[str, Any]) -> str:
    """A self-contained HTML page of the document (no scripts, nothing fetched from elsewhere)."""
    info = document["info"]
    out = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(info['title'])}</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:auto}pre{background:#f4f4f4;padding:.5em;"
        "overflow:auto}code.m{font-weight:bold}</style></head><body>",
        f"<h1>{html.escape(info['title'])} <small>{html.escape(info['version'])}</small></h1>",
        f"<p>{html.escape(info.get('description', ''))}</p>",
        f"<p>Machine-readable: <a href='{OPENAPI_PATH}'>{OPENAPI_PATH}</a> (OpenAPI {OPENAPI_VERSION}).</p>",
    ]
    for path, methods in document["paths"].items():
        for method, operation in methods.items():
            lock = " (bearer token)" if operation.get("security") else ""
            out.append(f"<h2><code class='m'>{method.upper()}</code> <code>{html.escape(path)}</code>{lock}</h2>")
            out.append(f"<p>{html.escape(operation['summary'])}</p>")
            if operation.get("description"):
                out.append(f"<p>{html.escape(operation['description'])}</p>")
            for parameter in operation.get("parameters", []):
                required = "required" if parameter["required"] else "optional"
                out.append(
                    f"<p>{parameter['in']} parameter <code>{html.escape(parameter['name'])}</code> ({required}): "
                    f"<code>{html.escape(json.dumps(parameter['schema']))}</code></p>"
                )
            if "requestBody" in operation:
                out.append(f"<p>Body:</p><pre>{html.escape(json.dumps(operation['requestBody'], indent=1))}</pre>")
            for status, reply in operation["responses"].items():
                media = ", ".join(reply.get("content", {})) or "no body"
                out.append(f"<p><b>{status}</b> {html.escape(reply['description'])} <i>({html.escape(media)})</i></p>")
    schemas = document["components"]["schemas"]
    if schemas:
        out.append(f"<h2>Schemas</h2><pre>{html.escape(json.dumps(schemas, indent=1))}</pre>")
    out.append("</body></html>")
    return "\n".join(out)
