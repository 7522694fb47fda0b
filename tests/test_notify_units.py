"""The notifier's pure parts: where messages go and how a secret URL is shown, what a message says, what
the notifier decides to send; the exit-code table; acknowledgements read from a damaged file.

    PYTHONPATH=src .venv/bin/python -m pytest -p no:xdist -q tests/test_notify_units.py
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trainguard import exitcodes
from trainguard.errors import UserError
from trainguard.notify import message
from trainguard.notify.notifier import Notifier
from trainguard.notify.targets import mask, parse_target, parse_targets, scrub
from trainguard.store.acks import add_ack, mark_acked, read_acks

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("url", "shown"), [
    ("https://hooks.slack.com/services/T0/B0/abcSECRET", "https://hooks.slack.com/services/***"),
    ("https://user:pw@example.org:8443/hook?token=abc&x=1", "https://***@example.org:8443/hook?token=***&x=***"),
    ("https://example.org", "https://example.org"),
    ("https://ntfy.sh/my-secret-topic", "https://ntfy.sh/***"),  # ntfy's topic is its secret
    ("https://h/TOKEN123", "https://h/***"),
    ("https://discord.com/api/webhooks/123/SECRET", "https://discord.com/api/webhooks/***"),
    ("slack+https://chat.example.org/services/T/B/SECRET", "slack+https://chat.example.org/services/***"),
    ("https://h/x?SECRET#frag", "https://h/***?***#***"),
    ("exec:/usr/bin/page-me --key SECRET", "exec:/usr/bin/page-me ***"),
    ("mailto:a@b.org", "mailto:a@b.org"),
])
def test_a_target_is_shown_masked(url: str, shown: str) -> None:
    assert mask(url) == shown
    if not url.startswith("mailto"):
        assert "SECRET" not in mask(url) and "pw" not in mask(url).replace("page-me", "")


# Tokens of the shapes services hand out, and every place of a URL that can carry one: none is ever shown.
_TOKENS = ["TOKEN123", "my-secret-topic", "xoxb0Zq9x", "3f2a9c0d1e4b5a6978c0d1e2f3a4b5c6",
           "0c8e6a0e-5a4b-4f7e-9d2c-1b3a5c7e9f00", "AbC_dEf-GhI.jKl~mN", "q%2Fw%3De", "9876543210"]
_PLACES = [
    "https://{t}@h.example/x", "https://u:{t}@h.example/x", "https://{t}:pw@h.example",
    "https://h.example/{t}", "https://h.example/{t}/", "https://h.example/hook/{t}", "https://h.example/a/{t}/b",
    "https://ntfy.sh/{t}", "https://hooks.slack.com/services/{t}/B0/C0", "https://hooks.slack.com/services/T0/{t}/C0",
    "https://hooks.slack.com/services/T0/B0/{t}", "https://discord.com/api/webhooks/1/{t}",
    "slack+https://chat.example.org/hooks/{t}", "https://h.example/x?key={t}", "https://h.example/x?a=1&b={t}",
    "https://h.example/x?{t}", "https://h.example/x#{t}", "https://h.example:8443/{t}?k={t}#{t}",
    "exec:/usr/bin/page-me --token {t}",
]


@pytest.mark.parametrize("place", _PLACES)
def test_no_token_is_shown_wherever_it_sits(place: str) -> None:
    for token in _TOKENS:
        url = place.format(t=token)
        target = parse_target(url)
        for shown in (mask(url), target.shown, repr(target), scrub(f"cannot post to {url}: 500", [target])):
            assert token not in shown and "***" in shown, (url, shown)
    # what may be shown is: the host, the port, a known service's words
    assert mask("https://hooks.slack.com/services/T0/B0/C0").startswith("https://hooks.slack.com/services/")
    assert mask("https://h.example:8443/x").startswith("https://h.example:8443/")


def test_targets_from_the_environment_and_flags() -> None:
    got = parse_targets(["slack+https://chat.example.org/hooks/x"],
                        env="https://a.example/h, mailto:a@b.org,c@d.org exec:/bin/true")
    assert [(t.kind, t.value) for t in got] == [
        ("webhook", "https://a.example/h"), ("email", "a@b.org,c@d.org"), ("exec", "/bin/true"),
        ("slack", "https://chat.example.org/hooks/x")]
    assert parse_target("https://hooks.slack.com/services/T/B/C").kind == "slack"
    assert "C" not in repr(parse_target("https://hooks.slack.com/services/T/B/CCCC")).split("***")[-1]


@pytest.mark.parametrize("bad", ["ftp://x.org/a", "mailto:nobody", "exec:", "https:///nohost", "hooks.example"])
def test_a_bad_target_is_one_line_of_bad_input(bad: str) -> None:
    with pytest.raises(UserError) as info:
        parse_target(bad)
    assert "\n" not in str(info.value)


def test_scrub_replaces_the_secret_form() -> None:
    t = parse_target("https://example.org/hook/SECRET")
    assert scrub(f"error posting to {t.value}: 404", [t]) == "error posting to https://example.org/hook/***: 404"


def test_a_crash_message_names_its_rank_place_and_fix(tmp_path: Path) -> None:
    f = {"code": "TG501", "name": "run-crashed", "severity": "error", "step": 7, "summary": "ValueError: bad",
         "where": "train.py:12", "fix": "check the batch", "evidence": {"origin_ranks": [3, 1]}}
    msg = message.finding_message(f, run_dir=tmp_path, state="crashed")
    assert msg["rank"] == 3 and "(rank 3)" in msg["title"] and msg["run_dir"] == str(tmp_path.resolve())
    assert "where: train.py:12" in msg["text"] and "fix: check the batch" in msg["text"]


def _notifier(tmp_path: Path, **kw: object) -> Notifier:
    n = Notifier(tmp_path, [], **kw)  # type: ignore[arg-type]
    n.sent: list = []  # type: ignore[misc]
    n._queue = n.sent.append  # type: ignore[method-assign]  # what would leave, without a receiver
    return n


def test_what_is_sent_errors_and_stalls_once_per_code_within_the_rate(tmp_path: Path) -> None:
    from trainguard.watchdog.stall import RUN_STALLED

    n = _notifier(tmp_path, also=(RUN_STALLED.name,))
    n.finding({"code": "TG301", "name": "nonfinite-loss", "severity": "warning"})
    n.finding({"code": "TG509", "name": "run-stalled", "severity": "warning"})
    n.finding({"code": "TG301", "name": "nonfinite-loss", "severity": "error"})
    n.finding({"code": "TG301", "name": "nonfinite-loss", "severity": "error", "step": 9})
    n.finding({"code": "TG101", "name": "lr-reaches-zero", "severity": "error", "acked": {"by": "x"}})
    assert [d["code"] for _, d in n.sent] == ["TG509", "TG301"]
    for i in range(20):
        n.finding({"code": f"TG9{i:02d}", "name": "x", "severity": "error"})
    assert len(n.sent) == 6 and n.held_back == 16  # RATE_MAX in the window; the rest counted for the end


def test_a_healthy_end_is_sent_only_when_asked(tmp_path: Path) -> None:
    healthy = {"state": "completed", "findings": []}
    quiet, asked = _notifier(tmp_path, close_wait=0.1), _notifier(tmp_path, close_wait=0.1, notify_end=True)
    quiet.close(healthy)
    asked.close(healthy)
    assert quiet.sent == [] and [k for k, _ in asked.sent] == ["end"]
    bad = _notifier(tmp_path, close_wait=0.1)
    bad.close({"state": "completed", "findings": [{"code": "TG301", "severity": "error"}]})
    assert [k for k, _ in bad.sent] == ["end"]


def test_an_acknowledged_error_leaves_a_completed_run_healthy(tmp_path: Path) -> None:
    add_ack(tmp_path, "TG301", "nonfinite-loss", "known")
    n = _notifier(tmp_path, close_wait=0.1)
    n.close({"state": "completed", "findings": [{"code": "TG301", "severity": "error"}]})
    assert n.sent == []


def test_acks_are_read_defensively(tmp_path: Path) -> None:
    (tmp_path / "acks.jsonl").write_text('garbage\n[1]\n{"code": 5}\n{"code": "TG522", "by": "a@h", "t": "x", "why": 3}\n'
                                         + json.dumps({"code": "TG522", "by": "later"}) + "\n")
    assert read_acks(tmp_path) == {"TG522": {"by": "a@h", "t": None, "why": "3"}}
    assert mark_acked([{"code": "TG522"}, {"code": "TG1"}], read_acks(tmp_path))[1] == {"code": "TG1"}
    (tmp_path / "acks.jsonl").unlink()
    (tmp_path / "acks.jsonl").symlink_to(tmp_path / "elsewhere")
    assert read_acks(tmp_path) == {}


def test_a_nodes_part_honours_the_whole_runs_acks(tmp_path: Path) -> None:
    (tmp_path / "node-1").mkdir()
    add_ack(tmp_path, "TG522", "x", "the whole run")
    add_ack(tmp_path / "node-1", "TG301", "y", "this node")
    assert set(read_acks(tmp_path / "node-1")) == {"TG522", "TG301"} and set(read_acks(tmp_path)) == {"TG522"}


def test_the_exit_code_table_is_the_one_the_code_uses() -> None:
    from trainguard.preflight.run import EXIT_INCOMPLETE
    from trainguard.watchdog import supervisor, verdict

    table = exitcodes.markdown_table()
    for code in (exitcodes.HEALTH, exitcodes.FAILED, exitcodes.HUNG, exitcodes.STOPPED, exitcodes.BAD_INPUT,
                 exitcodes.PREFLIGHT_INCOMPLETE, exitcodes.INTERNAL):
        assert f"| {code} |" in table
    assert (supervisor.FAIL_ON_EXIT, verdict.EXIT_FAILED, verdict.EXIT_HUNG, verdict.EXIT_STOPPED, EXIT_INCOMPLETE) \
        == (122, 123, 124, 125, 3)
    assert len({r.code for r in exitcodes.TABLE}) == len(exitcodes.TABLE)


def test_the_end_message_quotes_the_most_severe_open_finding(tmp_path: Path) -> None:
    # watch() alone lists the warning a finding grew from before its error: the error is what is quoted
    status = {"state": "completed", "health": "error", "step": 40, "findings": [
        {"code": "TG522", "name": "throughput-drop", "severity": "warning", "step": 3},
        {"code": "TG301", "name": "nonfinite-loss", "severity": "warning", "step": 20, "summary": "loss is nan"},
        {"code": "TG301", "name": "nonfinite-loss", "severity": "error", "step": 20, "cause": "rate",
         "summary": "at 21 of the 40 steps"},
        {"code": "TG101", "name": "lr-reaches-zero", "severity": "error", "step": 1, "acked": {"by": "a@h"}}]}
    msg = message.end_message(status, run_dir=tmp_path)
    assert (msg["code"], msg["severity"], msg["summary"]) == ("TG301", "error", "at 21 of the 40 steps"), msg
    assert "TG301 nonfinite-loss [error]: at 21 of the 40 steps" in msg["text"]
    assert msg["acknowledged"] == ["TG101 lr-reaches-zero"] and len(msg["findings"]) == 3


def test_a_cause_is_said_in_words_and_kept_as_its_label(tmp_path: Path) -> None:
    nan = {"code": "TG301", "name": "nonfinite-loss", "severity": "error", "cause": "rate", "summary": "x"}
    msg = message.finding_message(nan, run_dir=tmp_path, state="running")
    assert msg["cause_label"] == "rate" and msg["cause"] != "rate" and "non-finite" in msg["cause"], msg
    assert f"cause: {msg['cause']}" in msg["text"]
    hang = message.finding_message({**nan, "cause": "dataloader-worker"}, run_dir=tmp_path, state="hung")
    assert hang["cause"] == "dataloader worker" and hang["cause_label"] == "dataloader-worker"
    assert message.finding_message({**nan, "cause": None}, run_dir=tmp_path, state="x")["cause"] is None


def test_an_email_carries_its_date_and_message_id(tmp_path: Path) -> None:
    from email.utils import parsedate_to_datetime

    from trainguard.notify.send import compose

    msg = message.finding_message({"code": "TG301", "name": "nonfinite-loss", "severity": "error"},
                                  run_dir=tmp_path, state="running")
    mail = compose(parse_target("mailto:ops@test.invalid"), msg)
    assert parsedate_to_datetime(mail["Date"]).tzinfo is not None
    assert mail["Message-ID"].startswith("<") and mail["Message-ID"].endswith(">") and "@" in mail["Message-ID"]
    assert compose(parse_target("mailto:ops@test.invalid"), msg)["Message-ID"] != mail["Message-ID"]


def test_ls_counts_an_acknowledged_error_apart() -> None:
    from trainguard.report.runlist import finding_counts as _finding_counts

    found = [{"code": "TG301", "severity": "error", "acked": {"by": "a@h"}},
             {"code": "TG522", "severity": "warning"}, {"code": "TG101", "severity": "error"}]
    assert _finding_counts(found) == "1E 1W 1ack"
    assert _finding_counts(found[:1]) == "1ack"


def test_the_env_separator_is_what_the_help_and_the_docs_say() -> None:
    from click.testing import CliRunner

    from trainguard.cli import main

    comma = parse_targets([], env="https://a.example/h,mailto:a@b.org,c@d.org,exec:/bin/true --x")
    space = parse_targets([], env="https://a.example/h mailto:a@b.org,c@d.org  exec:/bin/true --x")
    assert comma == space and [t.kind for t in comma] == ["webhook", "email", "exec"]
    helped = " ".join(CliRunner().invoke(main, ["run", "--help"], terminal_width=200).output.split())
    docs = " ".join((Path(__file__).parent.parent / "docs" / "notify.md").read_text().split())
    for text in (helped, docs):
        assert "separated by commas or spaces" in text, text


def test_the_exit_line_quotes_the_most_severe_open_finding(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from trainguard.findings import Finding
    from trainguard.watchdog.supervisor import Supervisor

    found = [Finding(code=code, name=name, severity=sev, summary="x", step=step) for code, name, sev, step in (
        ("TG522", "throughput-drop", "warning", 3), ("TG101", "lr-reaches-zero", "error", 8),
        ("TG301", "nonfinite-loss", "error", 2))]
    said: list[str] = []
    add_ack(tmp_path, "TG301", "nonfinite-loss", "known")
    # the supervisor's own method, on the fields it reads: --fail-on warning counts the warning found first
    sup = SimpleNamespace(options=SimpleNamespace(fail_on="warning"), run_dir=tmp_path, findings=found,
                          _note=said.append)
    assert Supervisor._fail_on(sup, 0) == exitcodes.HEALTH  # type: ignore[arg-type]
    assert "2 finding(s)" in said[0] and "(the first: TG101 lr-reaches-zero;" in said[0], said


def test_the_live_line_counts_an_acknowledged_error_apart(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from trainguard.findings import Finding
    from trainguard.watchdog import statusline

    state = SimpleNamespace(reader=None, step=7, phase=None, scratch={})
    found = [Finding(code="TG301", name="nonfinite-loss", severity="error", summary="x"),
             Finding(code="TG522", name="throughput-drop", severity="warning", summary="y")]
    assert statusline.render(state, 60.0, found, None).endswith("1 error(s) 1 warning(s)")
    add_ack(tmp_path, "TG301", "nonfinite-loss", "known")
    line = statusline.render(state, 60.0, found, None, read_acks(tmp_path))
    assert line.endswith("0 error(s) 1 warning(s) (1 acknowledged)"), line
    assert statusline.render(state, 60.0, found[:1], None, {"TG301": {}}).endswith("healthy (1 acknowledged)")
