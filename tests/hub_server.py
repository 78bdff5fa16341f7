"""A Hugging Face Hub on 127.0.0.1 for the download tests: the routes and headers huggingface_hub relies on.

``HubServer`` serves files from memory the way the Hub's resolve route does:

- ``HEAD`` and ``GET /<owner>/<repo>/resolve/<revision>/<file>`` with ``ETag`` and ``X-Linked-Etag``
  (the file's sha256, as for an LFS file), ``X-Linked-Size``, ``X-Repo-Commit``, ``Content-Length``
  and ``Accept-Ranges``; ``Range: bytes=N-`` answers ``206`` with ``Content-Range``;
- 404 with ``X-Error-Code: RepoNotFound`` or ``EntryNotFound``, as the Hub answers;
- ``GET /api/models/<owner>/<repo>/tree/<revision>``: the file listing ``HfApi.list_repo_files`` reads.

Faults are queued per GET (``faults``, consumed one per GET) or set for every request (``always``):
``500`` (an error answer), ``cut`` (half the body, then the connection closes: huggingface_hub
resumes with a Range request), ``short`` (a GET that announces and sends half the file: a partial
file), ``wrong`` (other bytes of the same length: a checksum mismatch), ``html`` (an HTML page of
the same length) and ``portal`` (every answer an HTML page without the Hub's headers, as a captive
portal sends). ``gate``, when set, holds every GET until it is opened. ``requests`` records
``(method, path, Range, Authorization)`` of every request, so a test counts the downloads.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import re
import socket
import threading
from dataclasses import dataclass, field

__all__ = ["HubServer", "Request"]

COMMIT = "0123456789abcdef0123456789abcdef01234567"
RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<file>.+)$")
TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<revision>[^/?]+)")


@dataclass(frozen=True)
class Request:
    """One request the server answered."""

    method: str
    path: str
    range: str | None
    authorization: str | None


@dataclass
class HubServer:
    """The server's state; ``start()`` serves it on a free port of 127.0.0.1 in a thread."""

    files: dict[tuple[str, str], bytes] = field(default_factory=dict)  # (repo, file) -> bytes, at any revision
    faults: list[str] = field(default_factory=list)
    always: set[str] = field(default_factory=set)
    requests: list[Request] = field(default_factory=list)
    gate: threading.Event | None = None
    _server: http.server.ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        """The endpoint to give as ``HF_ENDPOINT``."""
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def add(self, repo: str, file: str, content: bytes) -> str:
        """Serve ``content`` as ``file`` of ``repo``; returns its sha256."""
        self.files[(repo, file)] = content
        return hashlib.sha256(content).hexdigest()

    def gets(self, file: str | None = None) -> list[Request]:
        """The GET requests of the resolve route (of ``file`` only, when given)."""
        return [request for request in self.requests if request.method == "GET" and "/resolve/" in request.path
                and (file is None or request.path.endswith("/" + file))]

    def start(self) -> "HubServer":
        """Serve in a daemon thread until ``stop()``."""
        state = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

            def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
                state._answer(self, head=True)

            def do_GET(self) -> None:  # noqa: N802
                state._answer(self, head=False)

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop serving and free the port (a held gate is opened first, so no handler waits for ever)."""
        if self.gate is not None:
            self.gate.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    # ------------------------------------------------------------------ answers
    def _answer(self, handler: http.server.BaseHTTPRequestHandler, *, head: bool) -> None:
        path = handler.path
        self.requests.append(Request("HEAD" if head else "GET", path, handler.headers.get("Range"),
                                     handler.headers.get("Authorization")))
        if "portal" in self.always:
            return self._send(handler, 200, {"Content-Type": "text/html"}, b"<html><body>Please log in</body></html>", head)
        tree = TREE.match(path)
        if tree and not head:
            return self._tree(handler, tree["repo"])
        resolve = RESOLVE.match(path.split("?", 1)[0])
        if resolve is None:
            return self._send(handler, 404, {}, b"not found", head)
        repo, file = resolve["repo"], resolve["file"]
        if not any(known == repo for known, _ in self.files):
            return self._send(handler, 404, {"X-Error-Code": "RepoNotFound"}, b"Repository not found", head)
        content = self.files.get((repo, file))
        if content is None:
            return self._send(handler, 404, {"X-Error-Code": "EntryNotFound", "X-Repo-Commit": COMMIT}, b"Entry not found", head)
        digest = hashlib.sha256(content).hexdigest()
        headers = {"ETag": f'"{digest}"', "X-Linked-Etag": f'"{digest}"', "X-Linked-Size": str(len(content)),
                   "X-Repo-Commit": COMMIT, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        if head:
            return self._send(handler, 200, headers, content, head=True)
        if self.gate is not None:
            self.gate.wait(timeout=120)
        fault = self.faults.pop(0) if self.faults else next(iter(self.always), None)
        if fault == "500":
            return self._send(handler, 500, {}, b"internal error", head=False)
        if fault == "wrong":
            content = bytes(byte ^ 0xFF for byte in content[:64]) + content[64:]
        if fault == "html":
            page = b"<!DOCTYPE html><html><body>Service unavailable</body></html>"
            content = page + b" " * (len(content) - len(page))
        start = 0
        asked = re.fullmatch(r"bytes=(\d+)-", handler.headers.get("Range") or "")
        if asked:
            start = int(asked.group(1))
            headers["Content-Range"] = f"bytes {start}-{len(content) - 1}/{len(content)}"
        body = content[start:]
        if fault == "short":
            body = body[: len(body) // 2]
        status = 206 if asked else 200
        if fault == "cut":
            # Announce the whole body, send half, close: the client sees the connection break mid-file.
            handler.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                handler.send_header(key, value)
            handler.end_headers()
            handler.wfile.write(body[: len(body) // 2])
            handler.wfile.flush()
            handler.close_connection = True
            handler.connection.shutdown(socket.SHUT_RDWR)
            return None
        return self._send(handler, status, headers, body, head=False)

    def _tree(self, handler: http.server.BaseHTTPRequestHandler, repo: str) -> None:
        entries = [{"type": "file", "path": file, "size": len(content), "oid": hashlib.sha1(content).hexdigest(),
                    "lfs": {"oid": hashlib.sha256(content).hexdigest(), "size": len(content), "pointerSize": 134}}
                   for (owner, file), content in self.files.items() if owner == repo]
        if not entries:
            return self._send(handler, 404, {"X-Error-Code": "RepoNotFound"}, b"Repository not found", head=False)
        return self._send(handler, 200, {"Content-Type": "application/json"}, json.dumps(entries).encode(), head=False)

    @staticmethod
    def _send(handler: http.server.BaseHTTPRequestHandler, status: int, headers: dict[str, str], body: bytes,
              head: bool) -> None:
        handler.send_response(status)
        for key, value in {**headers, "Content-Length": str(len(body))}.items():
            handler.send_header(key, value)
        handler.end_headers()
        if not head:
            try:
                handler.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):  # the client gave up (a test of a failure)
                pass
