"""Loopback TCP ports for the control plane, chosen at run time so that clusters never collide."""

import socket


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        # As the servers themselves do: a port with only TIME_WAIT connections left is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(preferred: int = 0, host: str = "127.0.0.1") -> int:
    """`preferred` when it is free, otherwise a port the kernel picks."""
    if preferred and port_is_free(preferred, host):
        return preferred
    with socket.socket() as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port
