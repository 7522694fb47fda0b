"""Real receivers on 127.0.0.1 for the notifier's tests: an HTTP server that records every POST (or answers
500, or never answers), a real SMTP server (aiosmtpd) that records every message, and a port that refuses."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import threading
from email import message_from_bytes
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
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
    """aiosmtpd's Controller on a free port of 127.0.0.1; `messages` are the parsed e-mails received.

    With `tls_dir`, a self-signed certificate for 127.0.0.1 is made there (openssl) and the server requires
    STARTTLS; with `login` (user, password), it requires that login, over TLS only. `sessions` says, per
    message, whether it came over TLS and by whom."""

    def __init__(self, tls_dir: Path | None = None, login: tuple[str, str] | None = None) -> None:
        from aiosmtpd.controller import Controller
        from aiosmtpd.smtp import AuthResult, LoginPassword

        self.messages: list[Message] = []
        self.rcpts: list[list[str]] = []
        self.sessions: list[tuple[bool, Any]] = []
        outer = self

        class Handler:
            async def handle_DATA(self, server: Any, session: Any, envelope: Any) -> str:  # noqa: N802
                outer.rcpts.append(list(envelope.rcpt_tos))
                outer.messages.append(message_from_bytes(envelope.content))
                outer.sessions.append((session.ssl is not None, session.auth_data))
                return "250 OK"

        def authenticator(server: Any, session: Any, envelope: Any, mechanism: str, data: Any) -> Any:
            ok = isinstance(data, LoginPassword) and (data.login.decode(), data.password.decode()) == login
            return AuthResult(success=ok, auth_data=data.login.decode() if ok else None)

        kwargs: dict[str, Any] = {}
        if tls_dir is not None:
            self.cafile = make_cert(tls_dir)
            ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            ctx.load_cert_chain(self.cafile, tls_dir / "key.pem")
            kwargs.update(tls_context=ctx, require_starttls=True)
        if login is not None:
            kwargs.update(authenticator=authenticator, auth_required=True, auth_require_tls=True)
        self.port = free_port()
        self.controller = Controller(Handler(), hostname="127.0.0.1", port=self.port, **kwargs)
        self.controller.start()

    def env(self) -> dict[str, str]:
        return {"TRAINGUARD_SMTP_HOST": "127.0.0.1", "TRAINGUARD_SMTP_PORT": str(self.port),
                "TRAINGUARD_SMTP_FROM": "trainguard@test.invalid"}

    def close(self) -> None:
        self.controller.stop()


def make_cert(folder: Path) -> Path:
    """A self-signed certificate for the IP 127.0.0.1 (and its key) in `folder`; returns the certificate."""
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(folder / "key.pem"), "-out", str(folder / "cert.pem"), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    return folder / "cert.pem"


def free_port() -> int:
    """A port nothing listens on (bound, then closed): connecting to it is refused."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
