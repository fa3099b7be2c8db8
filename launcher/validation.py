"""Checks of a create request that need no runtime: field sizes, environment variables and the port.

They run before anything is forked, so what would fail afterwards (a child that cannot set its
environment or bind its port) is a 400 or 409 naming the value instead of a 201 and a dead instance.
The size bounds keep every event about the instance under `MAX_EVENT_BYTES`, so one instance cannot
produce a watch line a client cannot read.
"""

import errno
import json
import os
import pwd
import socket
from collections.abc import Mapping
from typing import Any

from api.launcher import (
    MAX_ANNOTATIONS_BYTES,
    MAX_EFFECTIVE_OPTIONS_BYTES,
    MAX_ENV_VARS_BYTES,
    MAX_GPU_UUIDS_BYTES,
    MAX_OPTIONS_BYTES,
    ErrorReason,
    VllmConfig,
)

from .errors import BadRequest, Conflict, InvalidOptions

MAX_PORT = 65535
# A model directory holds a few dozen files at its top: the check stops here.
MAX_MODEL_FILES_CHECKED = 1000


def encoded_size(value: Any) -> int:
    """Bytes of `value` as compact JSON, as the launcher's events carry it (UTF-8, not \\u-escaped)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode())


def _check_size(field: str, value: Any, bound: int, error: type[BadRequest] = BadRequest, what: str = "") -> None:
    size = encoded_size(value)
    if size > bound:
        raise error(f"{field}: {what}{size} bytes as JSON, over the launcher's bound of {bound} bytes")


def check_body_sizes(config: VllmConfig) -> None:
    """The client's own fields, before the launcher adds to them."""
    _check_size("options", config.options, MAX_OPTIONS_BYTES)
    _check_size("annotations", config.annotations, MAX_ANNOTATIONS_BYTES)
    _check_size("gpu_uuids", config.gpu_uuids, MAX_GPU_UUIDS_BYTES)


def check_environment(env: Mapping[str, str]) -> None:
    """Names as Kubernetes accepts them for a container (printable ASCII but `=`), values without NUL,
    and the whole within its bound (`env` as the instance gets it, CUDA_VISIBLE_DEVICES included)."""
    for name, value in env.items():
        if not name or any(not " " <= c <= "~" or c == "=" for c in name):
            raise BadRequest(
                f"env_vars: {name!r} is not a valid environment variable name: use printable ASCII "
                "characters other than '='"
            )
        if "\0" in value:
            raise BadRequest(f"env_vars: the value of {name} contains a NUL byte, which no environment can hold")
    _check_size("env_vars", env, MAX_ENV_VARS_BYTES, what="with CUDA_VISIBLE_DEVICES as the launcher sets it, ")


def check_effective_options(effective_options: str) -> None:
    _check_size(
        "options",
        effective_options,
        MAX_EFFECTIVE_OPTIONS_BYTES,
        InvalidOptions,
        what="the effective command line (the options as the launcher quotes them, plus the flags it adds) is ",
    )


def check_port(port: int, own_port: int) -> None:
    """A port an instance can listen on and the launcher can reach it at."""
    if not 1 <= port <= MAX_PORT:
        raise InvalidOptions(f"invalid options: --port {port} is not a port; use 1-{MAX_PORT}")
    if port == own_port:
        raise InvalidOptions(f"invalid options: --port {port} is this launcher's own API port; choose another")


def check_port_free(host: str, port: int) -> None:
    """409 when another process of this host already listens where the instance would (best effort: the
    port could still be taken between this check and the instance's bind)."""
    try:
        addresses = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror:
        return  # not an address this check can bind; the instance will say
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except PermissionError:
                raise InvalidOptions(
                    f"invalid options: --port {port} needs a privilege this launcher does not have; use a port "
                    "above 1023"
                ) from None
            except OSError as err:
                if err.errno == errno.EADDRINUSE:
                    raise Conflict(
                        f"port {port} is already in use on {host} by a process that is not one of this "
                        "launcher's instances",
                        ErrorReason.PORT_IN_USE,
                    ) from None
                # Anything else is the instance's to meet (and report in its log).


def _this_user() -> str:
    """Who the launcher runs as, as a message names it (images run as arbitrary UIDs, not always in passwd)."""
    uid, gid = os.geteuid(), os.getegid()
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid}, gid {gid})"
    except KeyError:
        return f"uid {uid} (gid {gid})"


def unreadable_model_entry(model: str) -> str | None:
    """Why this process's user cannot read a local model path, naming the entry and the user; None when it can
    (or the model is not a local path).

    Forked anyway, such a model fails deep inside the runtime, after the fork and with a misleading error
    (safetensors' "No such file or directory" for a weights file of mode 0600), so creates check it first.
    A model directory's own files are its top-level ones (config, tokenizer, weights; a hub cache's snapshot
    links them to its blobs, and the links are followed); subdirectories and hidden files are not read by
    every runtime, so they are left to the runtime.
    """
    if not os.path.lexists(model):
        return None
    if not os.path.isdir(model):
        return _unreadable(model, model, os.R_OK, "file cannot be read")
    problem = _unreadable(model, model, os.R_OK | os.X_OK, "directory cannot be listed")
    if problem is not None:
        return problem
    with os.scandir(model) as listing:
        files = sorted(e.path for e in listing if not e.name.startswith(".") and not e.is_dir())
    for path in files[:MAX_MODEL_FILES_CHECKED]:
        problem = _unreadable(model, path, os.R_OK, "file cannot be read")
        if problem is not None:
            return problem
    return None


def _unreadable(model: str, path: str, mode: int, what: str) -> str | None:
    if not os.path.exists(path):
        return f"model path {model}: {path} is a symbolic link to nothing"
    if os.access(path, mode):
        return None
    return (
        f"model path {model}: this {what} by the launcher's user {_this_user()}: {path}; make the model readable "
        "by that user (for example files 0644 and directories 0755)"
    )
