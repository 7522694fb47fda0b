"""Real receivers on 127.0.0.1 for the notifier's tests: an HTTP server that records every POST (or answers
500, or never answers), a real SMTP server (aiosmtpd) that records every message, and a port that refuses."""

from __future__ import annotations

import json
import socket
import threading
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class HttpReceiver:
    """mode: "ok" (200), "500" (every POST answered 500), "hang" (reads the POST, never answers)."""

    def __init__(self, mode: str = "ok") -> None:
        self.mode = mode
        self.got: list[tuple[str, Any]] = []  # (path, JSON body) of every POST, answered or not
        self.release = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.got.append((self.path, json.loads(body)))
                if outer.mode == "hang":
                    outer.release.wait(120)
                    return
                self.send_response(500 if outer.mode == "500" else 200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}{path}"

    def bodies(self) -> list[Any]:
        return [body for _, body in self.got]

    def close(self) -> None:
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


class SmtpReceiver:
    """aiosmtpd's Controller on a free port of 127.0.0.1; `messages` are the parsed e-mails received."""

    def __init__(self) -> None:
        from aiosmtpd.controller import Controller

        self.messages: list[Message] = []
        self.rcpts: list[list[str]] = []
        outer = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
                outer.rcpts.append(list(envelope.rcpt_tos))
                outer.messages.append(message_from_bytes(envelope.content))
                return "250 OK"

        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port)
        self.controller.start()

    def env(self) -> dict[str, str]:
        return {"TRAINGUARD_SMTP_HOST": "127.0.0.1", "TRAINGUARD_SMTP_PORT": str(self.port),
                "TRAINGUARD_SMTP_FROM": "trainguard@test.invalid"}

    def close(self) -> None:
        self.controller.stop()


def free_port() -> int:
    """A port nothing listens on (bound, then closed): connecting to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
