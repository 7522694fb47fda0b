"""The report and the comparison, tested as a person would look at them (issue 7).

Real runs under `trainguard run` (a tiny torch LM, and a torch-free script whose every name is hostile),
real SQLite, real Chromium (Debian's `chromium`; the browser tests skip with a reason without it, and CI
installs it). Screenshots are kept under artifacts/ (gitignored) and their paths printed.

    pytest -q tests/test_report.py
    pytest -q tests/test_report.py -k hostile -s      # -s prints the screenshot paths

Every zoo scenario's report is checked by the zoo itself (`zoo.check_report`), so that part of the issue
is covered once per scenario in tests/test_zoo.py without running the scenarios twice.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from headless import ARTIFACTS, chromium, render
from tgtest import ROOT, run_trainguard

from trainguard.report.build import build_report
from trainguard.report.compare import speed, speedup
from trainguard.report.load import Column, RunData, load_run
from trainguard.report.series import BUCKETS, downsample

sys.path.insert(0, str(ROOT / "benchmarks"))
SCRIPTS = ROOT / "tests" / "scripts"
needs_chromium = pytest.mark.skipif(chromium() is None, reason="chromium is not installed (CI installs it in .ci/run)")


def _run(run_dir: Path, script: str, *args: str, timeout: float = 180) -> None:
    proc = run_trainguard("run", "--quiet", "--run-dir", str(run_dir), "--", sys.executable, str(SCRIPTS / script),
                          *args, timeout=timeout)
    assert (run_dir / "status.json").is_file(), proc.stderr[-2000:]
    assert f"report {run_dir}" in proc.stderr.replace("//", "/"), proc.stderr[-2000:]


# -- downsampling: spikes and NaNs survive a million steps -------------------------------------------


def test_downsample_keeps_a_one_step_spike_and_a_nan_among_a_million() -> None:
    rng = np.random.default_rng(1)
    n = 1_000_000
    x = np.arange(1, n + 1, dtype=float)
    y = 2 + 0.1 * rng.standard_normal(n)
    spike, nan, inf = 123_457, 876_543, 400_001
    y[spike - 1] = 60.0
    y[nan - 1] = np.nan
    y[inf - 1] = np.inf
    s = downsample("loss", x, y)
    assert len(s.x) <= 2 * BUCKETS + 2
    assert 60.0 in s.y and s.x[np.argmax(s.y)] == spike
    assert list(s.nan_x) == [nan] and list(s.inf_x) == [inf]
    # the trap it avoids: striding to the same number of points misses the spike
    stride = n // len(s.x)
    assert 60.0 not in y[::stride]
    # a dip survives as well as a spike, and the true minimum is kept
    y2 = 2 + 0.1 * rng.standard_normal(n)
    y2[777] = -5.0
    assert -5.0 in downsample("x", x, y2).y


def test_downsample_leaves_small_series_and_absent_values_alone() -> None:
    x = np.arange(10, dtype=float)
    y = np.array([1, 2, np.nan, 4, 5, 6, 7, 8, 9, 10], dtype=float)
    present = np.array([True] * 9 + [False])
    s = downsample("a", x, y, present)
    assert list(s.x) == [0, 1, 3, 4, 5, 6, 7, 8] and list(s.nan_x) == [2]  # absent (step 9) is not a NaN


def test_big_run_report_shows_the_spike_the_nan_and_the_finding(tmp_path: Path) -> None:
    from report_big_run import synthesize

    run_dir = tmp_path / "big"
    planted = synthesize(run_dir, 200_000)
    proc = run_trainguard("report", str(run_dir), timeout=120)
    assert proc.returncode == 0, proc.stderr
    page = (run_dir / "report.html").read_text()
    assert f'class="nan-marker" data-step="{planted["nan"]}" data-series="loss"' in page
    assert f'class="mark finding" data-step="{planted["nan"]}"' in page
    report = build_report(run_dir)
    loss = next(p for p in report.plots if p.key == "loss").series[0]
    assert loss.x[np.argmax(loss.y)] == planted["spike"] and len(loss.x) <= 2 * BUCKETS + 2
    assert len(report.timeline) < 100  # 40 evaluations, 80 phase edges, 4 checkpoints: elided, not dropped
    assert any("more like this" in r.what for r in report.timeline)
    md = (run_dir / "report.md").read_text()
    assert f"TG301 nonfinite-loss at step {planted['nan']}" in md.replace("\\", "")


# -- the command line ---------------------------------------------------------------------------------


def test_report_and_compare_reject_bad_input_in_one_line(tmp_path: Path) -> None:
    for args in (["report", str(tmp_path / "nope")], ["compare", str(tmp_path / "a"), str(tmp_path / "b")]):
        proc = run_trainguard(*args, cwd=tmp_path)
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert proc.stderr.startswith("trainguard: error:")


def test_a_report_that_cannot_be_written_never_changes_the_verdict(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    (run_dir / "report.html").mkdir(parents=True)  # the report cannot replace a folder
    proc = run_trainguard("run", "--quiet", "--run-dir", str(run_dir), "--", sys.executable, "-c", "print('hi')")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run_dir / "status.json").read_text())["state"] == "completed"
    assert "could not write the report" in (run_dir / "guard.log").read_text()


# -- hostile names ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("hostile") / "run-<b>x<i>\"'&amp;"
    _run(run_dir, "hostile_names.py")
    return run_dir


def test_hostile_names_stay_text(hostile_run: Path) -> None:
    page = (hostile_run / "report.html").read_text()
    status = json.loads((hostile_run / "status.json").read_text())
    assert status["state"] == "crashed"
    # nothing from the run opens a tag or an attribute: the page has no script, no img, no handler
    assert "<script" not in page and "<img" not in page and "' onmouseover='" not in page
    assert "&lt;script&gt;console.error(&quot;pwned-script&quot;)&lt;/script&gt;" in page
    # Markdown: raw text only inside code fences (inert there); outside them every '<' and '[' is escaped
    md = (hostile_run / "report.md").read_text()
    prose = re.sub(r"(?ms)^(`{3,})\n.*?^\1$", "", md)
    assert "`" * 3 not in prose and "pwned-img" in prose
    assert re.search(r"(?<!\\)<", prose) is None and re.search(r"(?<!\\)\]\(javascript", prose) is None
    printed = run_trainguard("report", str(hostile_run), "--print")
    assert printed.returncode == 0 and "pwned-img" in printed.stdout and "Findings" in printed.stdout


@needs_chromium
@pytest.mark.parametrize("csp", [True, False], ids=["with-csp", "escaping-alone"])
def test_hostile_names_execute_nothing_in_chromium(hostile_run: Path, tmp_path: Path, csp: bool) -> None:
    page = hostile_run / "report.html"
    if not csp:  # prove the escaping suffices by itself: take the page's Content-Security-Policy away
        text = page.read_text()
        start = text.index('<meta http-equiv="Content-Security-Policy"')
        page = tmp_path / "report-no-csp.html"
        page.write_text(text[:start] + text[text.index(">", start) + 1:])
    shot = ARTIFACTS / f"report-hostile-{'csp' if csp else 'nocsp'}.png"
    r = render(page, screenshot=shot)
    print(f"screenshot: {r.screenshot}")
    assert r.console == [], r.console  # no script ran, no image tried to load, no policy was violated
    assert "<script" not in r.dom and "<img" not in r.dom
    assert "pwned-script" in r.dom and "pwned-img" in r.dom  # shown, as text
    assert r.dom.count('<svg xmlns="http://www.w3.org/2000/svg" class="plot"') >= 4
    assert r.screenshot is not None


# -- a healthy run and the comparison of two real runs -------------------------------------------------


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("compare")
    a, b = base / "baseline", base / "fast"
    _run(a, "speedup_train.py", "--variant", "baseline")
    _run(b, "speedup_train.py", "--variant", "fast")
    return a, b


def test_compare_reports_the_speedup_within_the_measured_spread(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    a, b = two_runs
    proc = run_trainguard("compare", str(a), str(b), "--out", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    result = json.loads((tmp_path / "comparison.json").read_text())
    sp = result["speed"]
    assert sp["speedup_ci95"] is None and sp["run_to_run"]["known"] is False  # one run each
    lo, hi = sp["within_run_ci95"]
    qlo, qhi = sp["speedup_iqr_range"]
    # the fast variant drops three of four forward passes: clearly faster (about 3x idle; a loaded machine
    # pads both runs with waiting, which pulls the ratio towards 1), and the figure sits in its spread
    assert lo > 1.1 and lo <= sp["speedup"] <= hi and qlo <= sp["speedup"] <= qhi
    # an independent measure, the wall clock between the first and last recorded step of each run, agrees
    # with the steps' spread: a mean against quartiles, so within a margin (a load burst's slow steps count
    # in the mean alone: 1.60x against quartiles of 1.62-1.89x in one CI run)
    wall = [_seconds_per_step(r) for r in (a, b)]
    assert 0.85 * qlo <= wall[0] / wall[1] <= 1.15 * qhi, (wall, qlo, qhi)
    assert sp["a"]["throughput_unit"] == "samples/s" and sp["b"]["median_samples_per_s"] > sp["a"]["median_samples_per_s"]
    conv = result["convergence"]
    assert conv["matches"] is True and conv["common_steps"] == 60
    assert conv["eval"]["loss"]["final_matches"] and abs(conv["eval"]["loss"]["final_difference"]) < 1e-6
    assert result["findings"] == {"only_a": [], "only_b": [], "both": []}
    assert "B looks faster" in proc.stdout and "run-to-run variation is unknown" in proc.stdout
    assert "convergence matches" in proc.stdout
    md = (tmp_path / "comparison.md").read_text()
    assert "Speedup (median A / median B)" in md and "| loss |" in md
    # seed 000's orchestrator check, as exit codes: one run each, it refuses to decide; with the run-to-run
    # noise known (5%), met; then surely not met
    blind = run_trainguard("compare", str(a), str(b), "--out", str(tmp_path), "--min-speedup", "1.1")
    assert blind.returncode == 1 and "cannot decide on one run each" in blind.stderr, blind.stderr
    met = run_trainguard("compare", str(a), str(b), "--out", str(tmp_path), "--min-speedup", "1.1", "--same-convergence",
                         "--run-noise", "0.05")
    assert met.returncode == 0, met.stderr
    assert "B is faster" in met.stdout and "run-to-run variation included" in met.stdout
    unmet = run_trainguard("compare", str(a), str(b), "--out", str(tmp_path), "--min-speedup", "50", "--run-noise", "0.05")
    assert unmet.returncode == 1 and "not met: speedup >= 50x" in unmet.stderr
    if chromium():
        r = render(tmp_path / "comparison.html", screenshot=ARTIFACTS / "comparison.png")
        print(f"screenshot: {r.screenshot}")
        assert r.console == [] and r.dom.count('class="plot"') >= 3


def test_identical_runs_give_an_interval_that_contains_one(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    # The same baseline script three times more: four runs of one configuration, two a side. Within one
    # run the steps vary little, so one run against another alone can look "slower" or "faster" by the
    # machine's mood; with the repeats' spread in the interval, identical configurations are not told
    # apart. Two a side, because a side of one run cannot show its own spread: one run slowed by the
    # other test worker's burst (11% in one CI run) against two that agreed made a 95% interval of 0.80-1.00x.
    a, fast = two_runs
    again = [tmp_path / "baseline-2", tmp_path / "baseline-3", tmp_path / "baseline-4"]
    for run in again:
        _run(run, "speedup_train.py", "--variant", "baseline")
    proc = run_trainguard("compare", str(a), str(again[0]), "--repeat-a", str(again[1]), "--repeat-b", str(again[2]),
                          "--out", str(tmp_path))
    sp = json.loads((tmp_path / "comparison.json").read_text())["speed"]
    assert sp["run_to_run"]["known"] and sp["run_to_run"]["runs_a"] == 2 and sp["run_to_run"]["df"] == 2
    lo, hi = sp["speedup_ci95"]
    # A 95% interval misses the truth one time in twenty by design (one CI run: 1.002-1.07x); its coverage is
    # measured over many seeded trials below. Here, on real runs, identical configurations are never told
    # apart by more than a few percent, and the verdict follows the interval.
    assert lo <= 1.03 and hi >= 1 / 1.03, sp
    assert ("no measurable difference" in proc.stdout) == (lo <= 1.0 <= hi), proc.stdout
    # the gate decides on the interval with the repeats' spread in it (on a busy machine three baselines can
    # spread wider than the real 2-3x speedup: then it is honestly not met)
    faster = run_trainguard("compare", str(a), str(fast), "--repeat-a", str(again[0]), "--repeat-a", str(again[1]),
                            "--out", str(tmp_path), "--min-speedup", "1.1")
    sp = json.loads((tmp_path / "comparison.json").read_text())["speed"]
    assert sp["run_to_run"]["df"] == 2 and sp["speedup_ci95"][0] < sp["speedup"] < sp["speedup_ci95"][1]
    assert (faster.returncode == 0) == (sp["speedup_ci95"][0] >= 1.1), (faster.stderr, sp)
    bad = run_trainguard("compare", str(a), str(fast), "--run-noise", "2", "--out", str(tmp_path))
    assert bad.returncode == 2 and "--run-noise" in bad.stderr


def _synthetic_run(rng: np.random.Generator, factor: float, steps: int = 60) -> RunData:
    # one run's step times: the machine's mood for this run (factor) times each step's own jitter
    t = 0.02 * factor * np.exp(rng.normal(0, 0.05, steps))
    return RunData(Path("synthetic"), {}, {}, [], [], columns={"step_time": Column(t, np.ones(steps, bool))})


@pytest.mark.unit
@pytest.mark.parametrize("run_sd", [0.03, 0.10])
def test_the_interval_covers_one_for_identical_configurations_nineteen_times_in_twenty(run_sd: float) -> None:
    # The claim behind "95% interval": over many comparisons of identical configurations (two runs a side,
    # each run slowed or sped by a random 3% or 10%), the interval contains 1 at least ~95% of the time.
    # Within-run resampling alone would cover far less: the runs' moods are what it cannot see.
    rng = np.random.default_rng(2026)
    covered = 0
    trials = 300
    for _ in range(trials):
        a = [_synthetic_run(rng, math.exp(rng.normal(0, run_sd))) for _ in range(2)]
        b = [_synthetic_run(rng, math.exp(rng.normal(0, run_sd))) for _ in range(2)]
        sp = speedup(a[0], b[0], speed(a[0], None), speed(b[0], None), None, repeats_a=a[1:], repeats_b=b[1:])
        lo, hi = sp["speedup_ci95"]
        covered += lo <= 1.0 <= hi
    assert covered / trials >= 0.91, covered


@pytest.mark.unit
def test_the_interval_tells_a_real_speedup_from_the_runs_moods() -> None:
    # the other half of the claim: a real 1.3x with 3% run-to-run noise is called faster nearly always
    rng = np.random.default_rng(11)
    faster = 0
    for _ in range(100):
        a = [_synthetic_run(rng, 1.3 * math.exp(rng.normal(0, 0.03))) for _ in range(2)]
        b = [_synthetic_run(rng, math.exp(rng.normal(0, 0.03))) for _ in range(2)]
        sp = speedup(a[0], b[0], speed(a[0], None), speed(b[0], None), None, repeats_a=a[1:], repeats_b=b[1:])
        faster += sp["speedup_ci95"][0] > 1.0 and sp["verdict"].startswith("B is faster")
    assert faster >= 90, faster


def test_compare_says_when_convergence_differs(two_runs: tuple[Path, Path], tmp_path: Path) -> None:
    from trainguard.report.compare import compare

    a, b = load_run(two_runs[0]), load_run(two_runs[1])
    b.columns["loss"].values[-10:] *= 1.5  # the candidate's loss ends 50% higher
    assert compare(a, b)["convergence"]["loss"]["matches"] is False


def _seconds_per_step(run_dir: Path) -> float:
    import sqlite3

    conn = sqlite3.connect(f"file:{run_dir / 'run.db'}?mode=ro", uri=True)
    ts = [t for (t,) in conn.execute("SELECT t FROM steps WHERE rank = 0 ORDER BY step")]
    conn.close()
    skip = max(3, len(ts) // 20)  # the same warm-up the comparison leaves out
    return (ts[-1] - ts[skip]) / (len(ts) - 1 - skip)


@needs_chromium
def test_healthy_report_in_chromium_is_clean_and_says_what_it_checked(two_runs: tuple[Path, Path]) -> None:
    run_dir = two_runs[1]
    r = render(run_dir / "report.html", screenshot=ARTIFACTS / "report-healthy.png")
    print(f"screenshot: {r.screenshot}")
    assert r.console == [], r.console
    for key in ("loss", "lr", "grad", "throughput", "eval"):
        assert f'data-plot="{key}"' in r.dom, key
    assert ">completed<" in r.dom and "Findings (0)" in r.dom
    assert r.dom.count('class="r-passed"') >= 3  # what was checked, and passed
    md = (run_dir / "report.md").read_text()
    assert "No findings" in md and "| passed |" in md and "speedup_train" in md


# -- what other parts of trainguard leave in the run folder ------------------------------------------


def test_preflight_schedule_memory_samples_and_restarts_reach_the_report(tmp_path: Path) -> None:
    """Written with the real StoreWriter, in the shapes preflight (schedule.json), the probe's memory
    samples and a restarted attempt use; the report plots and lists them."""
    from trainguard.store.writer import StoreWriter

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    for attempt, steps in ((0, range(1, 31)), (1, range(21, 61))):  # attempt 1 resumes from step 20
        w = StoreWriter(run_dir, attempt=attempt)
        w.add_event("run", "start", {"pid": 1, "attempt": attempt}, t=1000.0 + attempt * 100)
        for s in steps:
            w.add_step({"step": s, "t": 1000.0 + attempt * 100 + s, "loss": 3 - s / 30, "lr": 1e-3 * (1 - s / 40),
                        "step_time": 0.1})
            if s % 10 == 0:
                w.add_event("sample", "memory", {"rss": (200 + s) * 2**20, "device": 0, "dev_allocated": 2**30,
                                                 "dev_total": 8 * 2**30, "dev_free": 2**31}, step=s)
        w.close()
    w = StoreWriter(run_dir, rank=-1)
    w.set_meta("plan", {"total_steps": 60})
    w.close()
    curve = [[k, 1e-3 * max(0.0, 1 - k / 40)] for k in range(1, 61)]
    (run_dir / "schedule.json").write_text(json.dumps({"curve": curve, "zero_at": 40, "total_steps": 60}))
    report = build_report(run_dir)
    lr = next(p for p in report.plots if p.key == "lr")
    assert [s.name for s in lr.series] == ["LR observed", "LR simulated by preflight"]
    assert any(m.kind == "plan" and m.step == 60 for m in lr.marks)
    mem = next(p for p in report.plots if p.key == "memory_samples")
    assert {s.name for s in mem.series} == {"rss (MiB)", "dev_allocated (MiB)", "dev_total (MiB)"}
    assert max(next(s for s in mem.series if s.name == "rss (MiB)").y) == 260
    restarts = [r for r in report.timeline if r.kind == "run" and "restart" in r.what]
    assert len(restarts) == 1 and restarts[0].attempt == 1
    loss = next(p for p in report.plots if p.key == "loss")
    assert list(loss.series[0].x) == list(range(1, 61))  # one point per step: the restarted attempt's
    assert any(m.kind == "restart" and m.step == 21 for m in loss.marks)
    checked = {c.code: c.result for c in report.checks}
    assert checked.get("TG506") == "passed"


def test_zoo_report_check_catches_a_report_that_leaves_a_finding_out(hostile_run: Path) -> None:
    """zoo.check_report runs on every zoo scenario; here it must pass the real report and fail a status
    that names a finding, a cause and evidence the report never showed."""
    import zoo

    status = json.loads((hostile_run / "status.json").read_text())
    assert zoo.check_report(hostile_run, status) == []
    status["findings"].append({"code": "TG999", "name": "never-shown", "severity": "error", "step": 7,
                               "cause": "no-such-cause", "evidence": {"no_such_number": 1}})
    problems = zoo.check_report(hostile_run, status)
    assert any("never-shown" in p for p in problems) and any("no-such-cause" in p for p in problems)
    assert any("no_such_number" in p for p in problems)
    assert zoo.check_report(hostile_run, {"findings": []}, quiet=True) != []  # it says 'No findings' nowhere


def test_columns_read_in_chunks_join_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Big runs are read in chunks; a part that first appears in a later chunk, a NaN and a NULL on either
    side of a chunk boundary all land where they belong."""
    import trainguard.report.load as load
    from trainguard.store.writer import StoreWriter

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    w = StoreWriter(run_dir)
    for s in range(1, 101):
        parts = {"kd": 1.0 / s} | ({"late": float(s)} if s > 70 else {})
        w.add_step({"step": s, "t": float(s), "loss": float("nan") if s == 30 else 2.0,
                    "grad_norm": None if s == 31 else 1.0, "parts": parts})
    w.close()
    monkeypatch.setattr(load, "CHUNK_ROWS", 30)
    d = load.load_run(run_dir)
    assert len(d.columns["loss"].values) == 100 and np.isnan(d.columns["loss"].values[29])
    assert d.columns["loss"].present[29] and not d.columns["grad_norm"].present[30]
    late = d.parts["late"]
    assert not late.present[:70].any() and late.present[70:].all() and late.values[99] == 100.0
    assert d.parts["kd"].values[0] == 1.0 and d.parts["kd"].present.all()


DDP_TWO_RANKS = """
import torch, torch.distributed as dist, trainguard
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
guard = trainguard.watch(model, opt, total_steps=40)
for step in range(40):
    loss = model(torch.randn(8, 8)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    guard.step(loss)
guard.finish()
dist.destroy_process_group()
"""


def test_the_timeline_tells_the_run_not_the_rules_bookkeeping(tmp_path: Path) -> None:
    """A 2-rank DDP job records a parameter checksum every few steps for the desync rule: kept in the store,
    never a timeline row (a new user's report listed 14 of them); each rank's probe row says its rank."""
    import sqlite3

    (tmp_path / "train.py").write_text(DDP_TWO_RANKS)
    run_dir = tmp_path / "run"
    proc = run_trainguard("run", "--quiet", "--run-dir", str(run_dir), "--", sys.executable, "-m",
                          "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "train.py",
                          cwd=tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with sqlite3.connect(run_dir / "run.db") as conn:
        kept = conn.execute("SELECT count(*) FROM events WHERE kind = 'contract' AND name = 'param-checksum'")
        assert kept.fetchone()[0] > 0  # the rule's data is in the store
    md = (run_dir / "report.md").read_text()
    timeline = md.split("## Timeline", 1)[1].split("\n## ", 1)[0]
    assert "param-checksum" not in timeline and "contract" not in timeline, timeline
    assert "probe start (rank 0)" in timeline and "probe start (rank 1)" in timeline, timeline
    assert "run ended: completed" in timeline


def test_the_loss_mean_says_which_steps_it_spans_when_values_come_every_few_steps(tmp_path: Path) -> None:
    """A log printed every 50 steps: "the mean of the last 10 steps" was the mean over 450 steps (a new
    user read a loss of 0.88 for a run at 0.09)."""
    from trainguard.report.build import key_numbers
    from trainguard.store.writer import StoreWriter

    for every, run in ((50, "sparse"), (1, "dense")):
        run_dir = tmp_path / run
        run_dir.mkdir()
        w = StoreWriter(run_dir)
        for s in range(every, 500 * every // 50 + 1, every):
            w.add_step({"step": s, "t": float(s), "loss": 5.0 / s})
        w.close()
        loss = dict(key_numbers(load_run(run_dir)))["loss"]
        if every == 50:
            assert "mean of the last 10 values, steps 50-500 " in loss, loss
        else:
            assert re.search(r"mean of the last 10 steps \d", loss), loss
