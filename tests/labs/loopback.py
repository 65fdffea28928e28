"""Loopback networking for the labs: a free TCP port, and a small HTTP server in a thread
(the stand-ins for AWS APIs moto lacks, proxies, captive portals)."""

from __future__ import annotations

import http.server
import socket
import threading


def free_port(host: str = "127.0.0.1", *more: str) -> int:
    """A TCP port nobody listens on right now at `host` nor at any of `more` (a server that
    listens on several addresses: each of them must be free, e.g. the other pytest worker's
    lab may hold the same loopback addresses on some port)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if all(_free(other, port) for other in more):
            return port
    raise OSError(f"no port free at {host} and {len(more)} more addresses in 50 tries")


def _free(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class QuietServer(http.server.ThreadingHTTPServer):
    """A threading HTTP server whose request threads never hold up the test's exit."""

    daemon_threads = True

    @property
    def url(self) -> str:
        return "http://%s:%d" % self.server_address[:2]

    def close(self) -> None:
        self.shutdown()
        self.server_close()


def serve(handler, host: str = "127.0.0.1", server_class: type = QuietServer
          ) -> tuple[str, QuietServer]:
    """An HTTP server for `handler` on a free port of `host`, in a thread: (url, server);
    `server.close()` stops it. `server_class` (a QuietServer) may carry state for the
    handler."""
    server = server_class((host, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server.url, server


def answering(*answers: tuple[int, bytes], host: str = "127.0.0.1"):
    """An HTTP server that answers the n-th GET with answers[n] as (status, body), the last
    one from then on (an AWS endpoint saying what a test wants): (url, server, seen), where
    `seen` gets each request's query as a dict."""
    import urllib.parse

    seen: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append(dict(urllib.parse.parse_qsl(urllib.parse.urlsplit(self.path).query)))
            code, body = answers[min(len(seen), len(answers)) - 1]
            self.send_response(code)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    url, server = serve(Handler, host)
    return url, server, seen
