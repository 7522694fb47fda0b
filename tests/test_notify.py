"""Notifiers against real receivers on 127.0.0.1: an HTTP server that records every POST (a generic webhook
and a Slack-compatible one), a real SMTP server (aiosmtpd) and a command hook. A NaN run, a hang, a crash
and a healthy run each produce exactly the messages expected; receivers that refuse, hang or answer 500
never slow a step beyond its budget nor change the run's outcome; an acknowledged finding is neither
alerted nor stopped on, while a later, different one still is.

    PYTHONPATH=src .venv/bin/python -m pytest -p no:xdist -q tests/test_notify.py
"""

from __future__ import annotations

import json
import re
import sqlite3
import sys
import textwrap
import time
from pathlib import Path

import pytest
from receivers import HttpReceiver, SmtpReceiver, free_port
from tgtest import run_trainguard

pytestmark = pytest.mark.process

# no torch: watch() records plain float losses; each step takes ~20 ms
NAN = textwrap.dedent('''
    import json, sys, time, trainguard
    guard = trainguard.watch(total_steps=40)
    gaps, last = [], time.perf_counter()
    for step in range(1, 41):
        time.sleep(0.02)
        guard.step(float("nan") if step >= 20 else 1.0 / step)
        now = time.perf_counter(); gaps.append(now - last); last = now
    guard.finish()
    if len(sys.argv) > 1:
        open(sys.argv[1], "w").write(json.dumps(gaps))
''')
HANG = textwrap.dedent('''
    import time, trainguard
    guard = trainguard.watch(total_steps=100)
    for step in range(1, 11):
        time.sleep(0.02)
        guard.step(1.0 / step)
    time.sleep(600)  # stuck: no progress, no output
''')
CRASH = textwrap.dedent('''
    import time, trainguard
    guard = trainguard.watch(total_steps=100)
    for step in range(1, 101):
        time.sleep(0.02)
        if step == 12:
            raise ValueError("the batch has no labels")
        guard.step(1.0 / step)
''')
HEALTHY = NAN.replace('float("nan") if step >= 20 else ', "")
# waits (stepping) for the test's ack, then NaN losses, then a stall of 7 s, then ends
ACKED = textwrap.dedent('''
    import os, time, trainguard
    guard = trainguard.watch(total_steps=400)
    step = 0
    def tick(nan=False):
        global step
        step += 1; time.sleep(0.02)
        guard.step(float("nan") if nan else 1.0 / step)
    deadline = time.time() + 60
    while not os.path.exists("go") and time.time() < deadline:
        tick()
    for _ in range(20):
        tick(nan=True)
    time.sleep(7)
    for _ in range(20):
        tick()
    guard.finish()
''')
HOOK = textwrap.dedent('''
    import os, sys
    with open(sys.argv[1], "a") as fh:
        fh.write(sys.stdin.read().replace("\\n", " ") + "\\n")
''')
SECRET = "XyZsecretT0ken"


def _events(bodies: list) -> list[tuple[str, str | None]]:
    return [(b["event"], b.get("code") if b["event"] == "finding" else b["state"]) for b in bodies]


@pytest.fixture(scope="module")
def http() -> object:
    r = HttpReceiver()
    yield r
    r.close()


@pytest.fixture(scope="module")
def smtp() -> object:
    r = SmtpReceiver()
    yield r
    r.close()


def _run(tmp: Path, script: str, *args: str, env: dict | None = None, timeout: float = 180) -> tuple:
    (tmp / "train.py").write_text(script)
    t0 = time.time()
    proc = run_trainguard("run", "--quiet", "--run-dir", "run", *args, "--", sys.executable, "train.py",
                          cwd=tmp, env=env, timeout=timeout)
    return proc, time.time() - t0


def _fresh(http: HttpReceiver, smtp: SmtpReceiver) -> None:
    http.got.clear()
    smtp.messages.clear()
    smtp.rcpts.clear()


def test_a_nan_run_sends_its_error_and_its_end_to_every_target(tmp_path: Path, http: HttpReceiver,
                                                                 smtp: SmtpReceiver) -> None:
    _fresh(http, smtp)
    (tmp_path / "hook.py").write_text(HOOK)
    slack = http.url(f"/services/T000/B000/{SECRET}").replace("http://", "slack+http://")
    proc, _ = _run(tmp_path, NAN, "--notify", http.url("/generic"), "--notify", slack,
                   "--notify", "mailto:ops@test.invalid",
                   "--notify", f"exec:{sys.executable} hook.py {tmp_path / 'hook.jsonl'}", env=smtp.env())
    assert proc.returncode == 122, proc.stderr  # completed with an error finding: not 0 by default
    generic = [b for p, b in http.got if p == "/generic"]
    assert _events(generic) == [("finding", "TG301"), ("end", "completed")], generic
    first, end = generic
    assert first["severity"] == "error" and first["step"] == 20 and first["fix"], first
    # the cause in words, its label apart (a program matches on "rate"; a person reads what it means)
    assert first["cause_label"] == "rate" and "non-finite" in first["cause"], first
    assert first["host"] and first["run_dir"] == str((tmp_path / "run").resolve())
    assert end["health"] == "error" and end["code"] == "TG301" and "TG301 nonfinite-loss" in end["text"]
    chat = [b for p, b in http.got if p.startswith("/services/")]
    assert [set(b) for b in chat] == [{"text"}, {"text"}], chat  # Slack's body: text only
    assert "TG301 nonfinite-loss [error] at step 20" in chat[0]["text"] and "run completed" in chat[1]["text"]
    subjects = [m["Subject"] for m in smtp.messages]
    assert len(subjects) == 2 and "TG301 nonfinite-loss at step 20" in subjects[0] and "completed" in subjects[1]
    assert smtp.rcpts == [["ops@test.invalid"]] * 2
    assert all(m["Date"] and m["Message-ID"] for m in smtp.messages), [dict(m) for m in smtp.messages]
    hooked = [json.loads(line) for line in (tmp_path / "hook.jsonl").read_text().splitlines()]
    assert _events(hooked) == [("finding", "TG301"), ("end", "completed")]
    # the Slack URL's token is a secret: never printed nor stored
    stored = sqlite3.connect(tmp_path / "run" / "run.db").execute("select value from meta").fetchall()
    guard_log = tmp_path / "run" / "guard.log"
    for text in (proc.stderr, proc.stdout, json.dumps(stored), guard_log.read_text() if guard_log.exists() else ""):
        assert SECRET not in text
    assert "slack+http://127.0.0.1" in json.dumps(stored) and "/services/***" in json.dumps(stored)


def test_a_hang_sends_the_stall_the_stop_and_the_end(tmp_path: Path, http: HttpReceiver, smtp: SmtpReceiver) -> None:
    _fresh(http, smtp)
    proc, _ = _run(tmp_path, HANG, "--stall-timeout", "2", "--hang-limit", "6", "--notify", http.url())
    assert proc.returncode == 124, proc.stderr
    assert _events(http.bodies()) == [("finding", "TG509"), ("finding", "TG502"), ("end", "hung")], http.bodies()
    stall, stop, end = http.bodies()
    assert stall["step"] == 10 and stall["where"] and "train.py" in stall["where"], stall
    assert stop["severity"] == "error" and stop["where"], stop
    assert end["state"] == "hung" and end["code"] == "TG502", end


def test_a_crash_sends_the_crash_with_its_place_and_the_end(tmp_path: Path, http: HttpReceiver,
                                                           smtp: SmtpReceiver) -> None:
    _fresh(http, smtp)
    proc, _ = _run(tmp_path, CRASH, "--notify", http.url())
    assert proc.returncode == 1, proc.stderr
    assert _events(http.bodies()) == [("finding", "TG501"), ("end", "crashed")], http.bodies()
    crash = http.bodies()[0]
    assert "ValueError" in crash["summary"] and "train.py" in (crash["where"] or ""), crash
    # no probe at all: the watchdog reads the crash from the output, and sends it as well
    _fresh(http, smtp)
    (tmp_path / "np").mkdir()
    proc, _ = _run(tmp_path / "np", "print('step 1 loss 2.0', flush=True)\nraise KeyError('labels')\n",
                   "--no-auto", "--notify", http.url())
    assert proc.returncode == 1, proc.stderr
    assert _events(http.bodies()) == [("finding", "TG501"), ("end", "crashed")], http.bodies()
    assert "KeyError" in http.bodies()[0]["summary"]


def test_a_kill_and_a_missing_artifact_are_sent(tmp_path: Path, http: HttpReceiver, smtp: SmtpReceiver) -> None:
    _fresh(http, smtp)
    (tmp_path / "k").mkdir()
    proc, _ = _run(tmp_path / "k", "import os, signal\nprint('step 1 loss 2.0', flush=True)\n"
                   "os.kill(os.getpid(), signal.SIGKILL)\n", "--no-auto", "--notify", http.url())
    assert proc.returncode == 137, proc.stderr
    assert _events(http.bodies()) == [("finding", "TG503"), ("end", "killed")], http.bodies()
    assert http.bodies()[1]["signal"] == "SIGKILL"
    _fresh(http, smtp)
    (tmp_path / "e").mkdir()
    proc, _ = _run(tmp_path / "e", "print('done')\n", "--no-auto", "--expect", "model.pt", "--notify", http.url())
    assert proc.returncode == 123, proc.stderr
    assert _events(http.bodies()) == [("finding", "TG504"), ("end", "failed")], http.bodies()
    assert "model.pt" in http.bodies()[0]["summary"] and http.bodies()[0]["fix"]


def test_a_healthy_run_sends_only_its_end_and_only_when_asked(tmp_path: Path, http: HttpReceiver,
                                                              smtp: SmtpReceiver) -> None:
    _fresh(http, smtp)
    proc, _ = _run(tmp_path, HEALTHY, "--notify", http.url(), "--notify", "mailto:me@test.invalid",
                   "--notify-end", env=smtp.env())
    assert proc.returncode == 0, proc.stderr
    assert _events(http.bodies()) == [("end", "completed")], http.bodies()
    assert http.bodies()[0]["health"] == "ok" and len(smtp.messages) == 1
    _fresh(http, smtp)
    (tmp_path / "again").mkdir()
    proc, _ = _run(tmp_path / "again", HEALTHY, "--notify", http.url())
    assert proc.returncode == 0 and http.got == [], (proc.stderr, http.got)


def test_watch_alone_notifies_without_a_watchdog(tmp_path: Path, http: HttpReceiver, smtp: SmtpReceiver) -> None:
    import os
    import subprocess

    _fresh(http, smtp)
    (tmp_path / "train.py").write_text(NAN)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
    env.update({"TRAINGUARD_NOTIFY": http.url(), "TRAINGUARD_RUN_DIR": str(tmp_path / "run")})
    proc = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert _events(http.bodies()) == [("finding", "TG301"), ("end", "completed")], http.bodies()
    assert http.bodies()[1]["health"] == "error"


def test_receivers_that_refuse_hang_or_fail_never_slow_a_step_nor_change_the_outcome(
        tmp_path: Path, http: HttpReceiver, smtp: SmtpReceiver) -> None:
    import os
    import subprocess

    hung, failing = HttpReceiver("hang"), HttpReceiver("500")
    refused = f"http://127.0.0.1:{free_port()}/hook"
    try:
        bad = f"{refused},{hung.url()},{failing.url()}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINGUARD_")}
        (tmp_path / "train.py").write_text(NAN)
        outcomes = {}
        for name, notify in (("base", ""), ("bad", bad)):
            run_env = {**env, "TRAINGUARD_RUN_DIR": str(tmp_path / name), "TRAINGUARD_NOTIFY": notify}
            t0 = time.time()
            proc = subprocess.run([sys.executable, "train.py", str(tmp_path / f"{name}.json")], cwd=tmp_path,
                                  env=run_env, capture_output=True, text=True, timeout=120)
            status = json.loads((tmp_path / name / "status.json").read_text())
            gaps = json.loads((tmp_path / f"{name}.json").read_text())
            outcomes[name] = (proc.returncode, status["state"], status["health"], max(gaps), time.time() - t0)
        base, with_bad = outcomes["base"], outcomes["bad"]
        print(f"(exit, state, health, slowest step s, wall s): {outcomes}")  # the figures, with pytest -s
        assert with_bad[:3] == base[:3] == (0, "completed", "error"), outcomes
        # the slowest step with three dead receivers: within 1 s (a step is 20 ms), or 3x the slowest step
        # without them when the machine's load made that one slow as well
        assert with_bad[3] < max(1.0, 3 * base[3]), outcomes
        # the script's exit waits for the notifier at most its close wait (15 s), never for the hung receiver
        assert with_bad[4] < base[4] + 25, outcomes
        assert len(failing.got) == 3 * 2, failing.got  # each of its two messages tried 3 times (retries)
        log = (tmp_path / "bad" / "guard.log").read_text()
        # once per target: the hung one when its tries end, or as left behind at the close wait
        assert log.count("notify ") == 3 and "not delivered after 3 attempts" in log, log
        # under the watchdog too: the exit code is the run's own, the wait bounded
        proc, took = _run(tmp_path, NAN, *sum((["--notify", u] for u in bad.split(",")), []))
        assert proc.returncode == 122 and took < 90, (proc.returncode, took, proc.stderr)
        for dead in (refused, failing.url()):  # said on stderr once each (a hung one may still be trying)
            assert proc.stderr.count(f"trainguard: notify {dead}") == 1, proc.stderr
    finally:
        hung.close()
        failing.close()


def test_an_acknowledged_finding_is_not_alerted_nor_stopped_on_and_a_later_one_still_is(
        tmp_path: Path, http: HttpReceiver, smtp: SmtpReceiver) -> None:
    import subprocess

    from tgtest import trainguard_cmd

    _fresh(http, smtp)
    (tmp_path / "train.py").write_text(ACKED)
    proc = subprocess.Popen(trainguard_cmd("run", "--quiet", "--run-dir", "run", "--stall-timeout", "3",
                                           "--stop-on", "nonfinite-loss", "--notify", http.url(), "--",
                                           sys.executable, "train.py"),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not (tmp_path / "run" / "status.json").exists() and time.time() < deadline:
            time.sleep(0.2)
        acked = run_trainguard("ack", str(tmp_path / "run"), "TG301", "--why", "planted by the test")
        assert acked.returncode == 0 and "TG301 nonfinite-loss acknowledged by" in acked.stdout, acked
        (tmp_path / "go").write_text("")
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 0, err  # not stopped on the acked finding (--stop-on), nor failed for it
    # the end message counts it as acknowledged, never as an open error beside "health ok"
    assert "health ok" in err and "trainguard: 0 error(s)" in err and " acknowledged" in err, err
    assert [code for event, code in _events(http.bodies()) if event == "finding"] == ["TG509"], http.bodies()
    status = json.loads((tmp_path / "run" / "status.json").read_text())
    nan = [f for f in status["findings"] if f["code"] == "TG301"]
    assert nan and all(f["acked"]["why"] == "planted by the test" and "@" in f["acked"]["by"] for f in nan)
    shown = run_trainguard("status", str(tmp_path / "run"))
    assert "acknowledged by" in shown.stdout and "planted by the test" in shown.stdout, shown.stdout
    assert "acknowledged" in (tmp_path / "run" / "report.md").read_text()


def test_ack_after_the_run_changes_what_status_says(tmp_path: Path) -> None:
    proc, _ = _run(tmp_path, NAN)
    assert proc.returncode == 122
    before = json.loads(run_trainguard("status", "--json", str(tmp_path / "run")).stdout)
    assert before["health"] == "error"
    assert run_trainguard("ack", str(tmp_path / "run"), "nonfinite-loss").returncode == 0
    after = json.loads(run_trainguard("status", "--json", str(tmp_path / "run")).stdout)
    assert after["health"] == "ok" and all("acked" in f for f in after["findings"] if f["code"] == "TG301")
    # every summary counts it as acknowledged, not as an open error: status, ls, the report
    line = run_trainguard("status", str(tmp_path / "run")).stdout.splitlines()[0]
    assert "health ok (" in line and "acknowledged" in line and "error" not in line, line
    listed = run_trainguard("ls", "--root", str(tmp_path)).stdout
    assert "1ack" in listed and not re.search(r"\b\d+E\b", listed), listed
    assert run_trainguard("report", str(tmp_path / "run")).returncode == 0
    report = (tmp_path / "run" / "report.md").read_text()
    assert "**health: ok**" in report and "> TG301" not in report, report[:600]
    exported = run_trainguard("export", str(tmp_path / "run"), "--sink", f"prometheus={tmp_path / 'm.prom'}")
    assert exported.returncode == 0, exported.stderr
    series = [line for line in (tmp_path / "m.prom").read_text().splitlines() if line.startswith("trainguard_finding{")]
    assert series and all(line.endswith(" 0.0") for line in series if 'code="TG301"' in line), series
    bad = run_trainguard("ack", str(tmp_path / "run"), "TG999")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "unknown rule" in bad.stderr


def test_email_logs_in_only_over_starttls_with_a_verified_certificate(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from trainguard.notify.notifier import Notifier
    from trainguard.notify.targets import parse_target

    status = {"state": "crashed", "exit_code": 1, "findings": [
        {"code": "TG501", "name": "run-crashed", "severity": "error", "summary": "ValueError: x", "step": 3}]}
    secure = SmtpReceiver(tls_dir=tmp_path / "tls", login=("tg", "s3cret"))
    plain = SmtpReceiver()
    try:
        for key, value in {"TRAINGUARD_SMTP_HOST": "127.0.0.1", "TRAINGUARD_SMTP_PORT": str(secure.port),
                           "TRAINGUARD_SMTP_USER": "tg", "TRAINGUARD_SMTP_PASSWORD": "s3cret",
                           "TRAINGUARD_SMTP_CAFILE": str(secure.cafile)}.items():
            monkeypatch.setenv(key, value)
        (tmp_path / "a").mkdir()
        Notifier(tmp_path / "a", [parse_target("mailto:ops@test.invalid")], close_wait=30).close(status)
        assert secure.sessions == [(True, "tg")], secure.sessions  # over TLS, logged in
        assert "crashed" in secure.messages[0]["Subject"]
        # the same credentials to a server without STARTTLS: refused by trainguard, said once in guard.log
        monkeypatch.setenv("TRAINGUARD_SMTP_PORT", str(plain.port))
        (tmp_path / "b").mkdir()
        Notifier(tmp_path / "b", [parse_target("mailto:ops@test.invalid")], close_wait=30).close(status)
        assert plain.messages == []
        log = (tmp_path / "b" / "guard.log").read_text()
        assert "credentials are never sent in the clear" in log and "s3cret" not in log, log
    finally:
        secure.close()
        plain.close()
