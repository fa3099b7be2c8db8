"""A tiny HTTP server for Pods (image `dualpods/test-http`): `/healthz`, `/env`, `/hostname`.

It binds the address given with `--host` (Pods pass `$(POD_IP)`: all Pods share the host's network
here), logs SIGTERM and exits 0 on it unless `--ignore-sigterm`, to test grace periods.
"""

import argparse
import json
import os
import signal
import socket
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import FrameType


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        routes = {
            "/healthz": "ok",
            "/env": json.dumps(dict(os.environ)),
            "/hostname": socket.gethostname(),
        }
        body = routes.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write((body or "not found").encode())

    def log_message(self, format: str, *args: object) -> None:
        """Requests are not worth a log line (probes would flood the container log)."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--ignore-sigterm", action="store_true")
    args = parser.parse_args()

    def on_term(signum: int, _: FrameType | None) -> None:
        print(f"got signal {signum}", flush=True)
        if not args.ignore_sigterm:
            sys.exit(0)

    signal.signal(signal.SIGTERM, on_term)
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"serving on {args.host}:{args.port} as pid {os.getpid()}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
