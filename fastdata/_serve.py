"""A file server on 127.0.0.1 that answers HTTP Range requests as object stores do, to stream
shards over real HTTP in tests and benchmarks (Python's http.server ignores Range)."""

from __future__ import annotations

import http.server
import os
import re
import threading
from contextlib import contextmanager
from typing import Iterator

_RANGE = re.compile(r"bytes=(\d+)-(\d*)$")


class _Handler(http.server.BaseHTTPRequestHandler):
    root = "."
    ranges = True
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        path = os.path.join(self.root, self.path.lstrip("/").split("?")[0])
        try:
            f = open(path, "rb")
        except OSError:
            self.send_error(404)
            return
        with f:
            size = os.fstat(f.fileno()).st_size
            start, end = 0, size
            m = _RANGE.match(self.headers.get("Range", "")) if self.ranges else None
            if m:
                start = min(int(m.group(1)), size)
                end = min(int(m.group(2)) + 1, size) if m.group(2) else size
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes" if self.ranges else "none")
            self.end_headers()
            self.wfile.flush()
            try:
                self.connection.sendfile(f, start, end - start)  # the kernel copies: no Python loop
            except (BrokenPipeError, ConnectionResetError):
                return


@contextmanager
def serve(root: str | os.PathLike, ranges: bool = True) -> Iterator[str]:
    """Serves the files under `root` on a free port of 127.0.0.1; yields the base URL
    ("http://127.0.0.1:PORT"). `ranges=False` serves whole files only, as a server that
    ignores Range does."""
    handler = type("Handler", (_Handler,), {"root": os.fspath(root), "ranges": ranges})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, name="fastdata-serve", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
