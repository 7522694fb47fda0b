"""Where a message goes: `--notify URL` (repeatable) and $TRAINGUARD_NOTIFY, parsed once, before the run.

    https://host/path            a generic webhook: the message as JSON, POSTed
    slack+https://host/path      a Slack-compatible incoming webhook ({"text": ...}); a hooks.slack.com URL
                                 is one without the prefix (Mattermost, Rocket.Chat take the same body)
    mailto:ops@example.org,me@example.org
                                 e-mail over SMTP: the server and its credentials come from the environment
                                 (TRAINGUARD_SMTP_HOST, _PORT, _USER, _PASSWORD, _FROM, _STARTTLS), never
                                 from the command line, which other users of the machine can read
    exec:/path/to/hook --flag    a command: the message as JSON on its stdin, its text in
                                 $TRAINGUARD_NOTIFY_TEXT (run without a shell)

A webhook URL is a secret (whoever holds a Slack hook URL can post to the channel): `Target.shown`, the
form that is ever printed or stored (guard.log, the run's meta, errors), keeps the scheme, the host, the
port and the path's leading words that name a known service's hook (`services` of a Slack URL), and masks
the user and password, the rest of the path, every query value and the fragment.
"""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from urllib.parse import urlsplit

from trainguard.contract import ENV_NOTIFY
from trainguard.errors import UserError

KINDS = ("webhook", "slack", "email", "exec")
MASK = "***"
_ADDRESS = re.compile(r"^[^@\s,]+@[^@\s,]+$")


@dataclass(frozen=True)
class Target:
    kind: str  # one of KINDS
    value: str  # the URL to POST to, the addresses (comma-separated), or the command line
    shown: str  # the masked form: the only one printed or stored

    def __repr__(self) -> str:  # never the secret, whatever prints the object
        return f"Target({self.kind}, {self.shown})"


def parse_targets(flags: tuple[str, ...] | list[str], env: str | None = None) -> list[Target]:
    """$TRAINGUARD_NOTIFY (comma- or whitespace-separated) then each --notify flag; a bad one is a UserError
    that shows it masked. The same target twice is kept once."""
    env = os.environ.get(ENV_NOTIFY, "") if env is None else env
    raw = [item for item in re.split(r"[\s,]+(?=[a-z+]+:)", env.strip()) if item] + [f for f in flags if f.strip()]
    out: dict[tuple[str, str], Target] = {}
    for item in raw:
        target = parse_target(item.strip().rstrip(","))
        out.setdefault((target.kind, target.value), target)
    return list(out.values())


def parse_target(text: str) -> Target:
    scheme, sep, rest = text.partition(":")
    scheme = scheme.lower()
    if not sep:
        raise UserError(f"--notify {mask(text)}: give a URL (https://...), slack+https://..., mailto:ADDR or exec:COMMAND")
    if scheme == "exec":
        try:
            argv = shlex.split(rest)
        except ValueError as exc:
            raise UserError(f"--notify exec: cannot split the command ({exc})") from None
        if not argv:
            raise UserError("--notify exec: no command given (exec:/path/to/hook)")
        return Target("exec", rest.strip(), mask(text))
    if scheme == "mailto":
        addresses = [a.strip() for a in rest.split("?")[0].split(",") if a.strip()]
        bad = [a for a in addresses if not _ADDRESS.match(a)]
        if not addresses or bad:
            raise UserError(f"--notify mailto: {', '.join(bad) or 'no address'} is not an e-mail address")
        return Target("email", ",".join(addresses), f"mailto:{','.join(addresses)}")
    kind = "webhook"
    url = text
    if scheme in ("slack+http", "slack+https"):
        kind, url = "slack", text[len("slack+"):]
    elif scheme not in ("http", "https"):
        raise UserError(f"--notify {mask(text)}: unknown kind {scheme!r}: use https://, slack+https://, mailto: or exec:")
    parts = urlsplit(url)
    if not parts.hostname:
        raise UserError(f"--notify {mask(text)}: no host in the URL")
    if parts.hostname.lower() == "hooks.slack.com":
        kind = "slack"
    return Target(kind, url, mask(text))


# The path words of known services that name the kind of hook, never a secret: shown as long as every
# segment before them was one too. Anything else after the host may be a token (ntfy's topic is its
# secret; a generic hook's first segment often is), so it is masked.
PUBLIC_WORDS: dict[str, tuple[str, ...]] = {
    "hooks.slack.com": ("services", "workflows", "triggers"),
    "discord.com": ("api", "webhooks"), "discordapp.com": ("api", "webhooks"),
    "chat.googleapis.com": ("v1", "spaces"),
}
# Mattermost's and Rocket.Chat's incoming hooks live on the user's own host: these words say so on any host
ANY_HOST_WORDS = ("hooks", "hook", "webhook", "webhooks")
_QUERY_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")


def mask(text: str) -> str:
    """A target as it may be shown: the scheme, the host, the port, and the path's leading words that name
    a known service's hook (PUBLIC_WORDS); the user and password, the rest of the path, query values (and a
    query item without a name) and the fragment as ***. `exec:` keeps the program and masks its arguments
    (a token may be one)."""
    scheme, sep, rest = text.partition(":")
    if not sep:
        return MASK
    if scheme.lower() == "exec":
        try:
            argv = shlex.split(rest)
        except ValueError:
            return f"exec:{MASK}"
        return f"exec:{argv[0]}" + (f" {MASK}" if len(argv) > 1 else "") if argv else "exec:"
    if scheme.lower() == "mailto":
        return text
    try:
        parts = urlsplit(text)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return f"{scheme}:{MASK}"
    if ":" in host:  # an IPv6 address keeps its brackets
        host = f"[{host}]"
    user = f"{MASK}@" if "@" in parts.netloc else ""  # a user name may be a token too (https://TOKEN@host)
    # a slack+ URL has Slack's form on any host (a self-hosted receiver of Slack's body)
    known = PUBLIC_WORDS["hooks.slack.com"] if scheme.lower().startswith("slack+") else PUBLIC_WORDS.get(host, ())
    words = known + ANY_HOST_WORDS
    segments = parts.path.split("/")[1:] if parts.path.startswith("/") else [s for s in [parts.path] if s]
    shown: list[str] = []
    for i, segment in enumerate(segments):
        if segment == "" and i == len(segments) - 1:  # a trailing slash carries nothing
            shown.append(segment)
            break
        if segment.lower() not in words:
            shown.append(MASK)  # one *** for all the rest: not even how many segments there were
            break
        shown.append(segment)
    path = "/" + "/".join(shown) if parts.path.startswith("/") or shown else ""
    query = ""
    if parts.query:
        items = [q.split("=", 1) for q in parts.query.split("&") if q]
        query = "?" + "&".join(f"{q[0]}={MASK}" if len(q) == 2 and _QUERY_KEY.match(q[0]) else MASK
                               for q in items)
    fragment = f"#{MASK}" if parts.fragment else ""
    return f"{scheme}://{user}{host}{port}{path}{query}{fragment}"


def scrub(text: str, targets: list[Target]) -> str:
    """`text` (an exception's message, say) with every target's secret form replaced by its masked one."""
    for t in targets:
        if t.value and t.value in text:
            text = text.replace(t.value, t.shown)
    return text
