"""One delivery of one message to one target, bounded in time. Raises on failure; `Retry` for a failure
worth trying again (no connection, a timeout, a 5xx or 429 answer), anything else for one that is not
(a 4xx answer: the URL or the payload is wrong, and saying it again will not help).

HTTP goes through httpx (a timeout on connect, each read and each write; no redirect followed, so a
webhook's body never lands somewhere its owner did not name); e-mail through smtplib and email; a hook
command through subprocess, without a shell, killed at its timeout.
"""

from __future__ import annotations

import json
import os
import smtplib
import ssl
import subprocess
from email.message import EmailMessage
from typing import Any

from trainguard.notify.targets import Target

TIMEOUT = 5.0  # seconds for a connection, each read and each write (HTTP, SMTP), or a hook command


class Retry(Exception):
    """A failure that may pass: try again after a back-off."""


def deliver(target: Target, msg: dict[str, Any], timeout: float = TIMEOUT) -> None:
    if target.kind in ("webhook", "slack"):
        _post(target, msg, timeout)
    elif target.kind == "email":
        _mail(target, msg, timeout)
    else:
        _exec(target, msg, timeout)


def _post(target: Target, msg: dict[str, Any], timeout: float) -> None:
    import httpx  # imported here: the CLI and `import trainguard` stay light

    body = {"text": msg["text"]} if target.kind == "slack" else msg
    try:
        answer = httpx.post(target.value, json=body, timeout=timeout, follow_redirects=False,
                            headers={"User-Agent": "trainguard-notify"})
    except httpx.TimeoutException as exc:
        raise Retry(f"no answer within {timeout:g} s ({type(exc).__name__})") from None
    except httpx.TransportError as exc:  # refused, reset, DNS: the receiver may come back
        raise Retry(f"cannot connect ({type(exc).__name__})") from None
    if answer.status_code >= 500 or answer.status_code == 429:
        raise Retry(f"HTTP {answer.status_code}")
    if answer.status_code >= 300:
        raise RuntimeError(f"HTTP {answer.status_code}: the receiver refused the message")


def smtp_settings(environ: Any = None) -> dict[str, Any]:
    env = os.environ if environ is None else environ
    port = env.get("TRAINGUARD_SMTP_PORT", "587")
    return {
        "host": env.get("TRAINGUARD_SMTP_HOST", "localhost"),
        "port": int(port) if str(port).isdigit() else 587,
        "user": env.get("TRAINGUARD_SMTP_USER") or None,
        "password": env.get("TRAINGUARD_SMTP_PASSWORD") or None,
        "sender": env.get("TRAINGUARD_SMTP_FROM") or None,
        # auto: STARTTLS when the server offers it; always: refuse a server that does not; never: plain
        "starttls": (env.get("TRAINGUARD_SMTP_STARTTLS") or "auto").lower(),
        "cafile": env.get("TRAINGUARD_SMTP_CAFILE") or None,  # a private CA's certificate (PEM) to trust
    }


def compose(target: Target, msg: dict[str, Any], sender: str | None = None) -> EmailMessage:
    """The e-mail of one message. Date and Message-ID are set here: servers are not bound to add them, and
    a mail without them is sorted wrongly, threaded wrongly or scored as spam."""
    from email.utils import formatdate, make_msgid

    host = msg.get("host") or "localhost"
    mail = EmailMessage()
    mail["Subject"] = msg["title"]
    mail["From"] = sender or f"trainguard@{host}"
    mail["To"] = target.value
    mail["Date"] = formatdate(localtime=True)
    mail["Message-ID"] = make_msgid("trainguard", domain=host)
    mail.set_content(msg["text"] + "\n\n" + json.dumps(msg, indent=2, default=str) + "\n")
    return mail


def _mail(target: Target, msg: dict[str, Any], timeout: float) -> None:
    cfg = smtp_settings()
    mail = compose(target, msg, cfg["sender"])
    try:
        with smtplib.SMTP(cfg["host"], cfg["port"], timeout=timeout) as smtp:
            smtp.ehlo()
            if cfg["starttls"] != "never" and smtp.has_extn("starttls"):
                smtp.starttls(context=ssl.create_default_context(cafile=cfg["cafile"]))
                smtp.ehlo()
                secure = True
            else:
                secure = False
            if cfg["starttls"] == "always" and not secure:
                raise RuntimeError(f"SMTP server {cfg['host']}:{cfg['port']} offers no STARTTLS "
                                   "(TRAINGUARD_SMTP_STARTTLS=always)")
            if cfg["user"]:
                if not secure:
                    # Why refuse: a password sent in the clear is worse than a message not sent.
                    raise RuntimeError(f"SMTP server {cfg['host']}:{cfg['port']} offers no STARTTLS: "
                                       "credentials are never sent in the clear")
                smtp.login(cfg["user"], cfg["password"] or "")
            smtp.send_message(mail)
    except (OSError, smtplib.SMTPServerDisconnected, smtplib.SMTPConnectError) as exc:
        # OSError covers a refused connection and a timeout; a 4xx reply is transient by SMTP's own rules
        raise Retry(f"SMTP {cfg['host']}:{cfg['port']}: {type(exc).__name__}: {exc}") from None
    except smtplib.SMTPResponseException as exc:
        if 400 <= exc.smtp_code < 500:
            raise Retry(f"SMTP {exc.smtp_code}") from None
        raise RuntimeError(f"SMTP {exc.smtp_code}: {exc.smtp_error!r}") from None


def _exec(target: Target, msg: dict[str, Any], timeout: float) -> None:
    import shlex

    argv = shlex.split(target.value)
    env = {**os.environ, "TRAINGUARD_NOTIFY_TEXT": msg["text"], "TRAINGUARD_NOTIFY_TITLE": msg["title"],
           "TRAINGUARD_NOTIFY_EVENT": str(msg.get("event"))}
    try:
        done = subprocess.run(argv, input=json.dumps(msg, default=str).encode(), env=env, timeout=timeout,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    except subprocess.TimeoutExpired:
        raise Retry(f"the hook ran past {timeout:g} s and was killed") from None
    except OSError as exc:
        raise RuntimeError(f"cannot start the hook: {exc.strerror or exc}") from None
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"the hook exited {done.returncode}" + (f": {tail[0][:200]}" if tail[0] else ""))
