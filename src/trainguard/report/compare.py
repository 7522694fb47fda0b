"""`trainguard compare RUN_A RUN_B`: is B faster than A, does it still converge the same, what changed.

Seed 000 had to check "speedup >= 25%, convergence similar" between a baseline and an optimized run and
never wrote its comparison. This writes it: comparison.json (the numbers), .md and .html (the curves).

Speed: the median step time of each run (the first `warmup` steps left out: compilation, caches), its
spread as the interquartile range, and the speedup median(A) / median(B) with a 95% interval, so "1.8x"
comes with how sure it is. Two runs of the same script on the same machine differ by more than the
steps of one run vary (other processes, clocks, caches, placement), so the interval must include the
run-to-run variation: from repeats of either side (`--repeat-a`, `--repeat-b`: the spread of the
repeats' medians, pooled, with Student's t), or from `--run-noise` (the relative spread of one run's
median, measured before). With one run each and no `--run-noise` only the within-run interval (the
steps resampled 2,000 times) is known; it is shown as such, and a gate (`--min-speedup`) refuses to
decide on it.
Convergence: the loss curves aligned by step; over the last 10% of the shared steps, the mean loss of
each and the step-to-step noise. They match when the difference is within that noise (at least 1%);
evaluation metrics are compared final-to-final and best-to-best against the same relative tolerance.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from trainguard.report.load import RunData, load_run
from trainguard.report.plots import samples_per_step
from trainguard.report.series import downsample
from trainguard.report.svg import Plot, esc, render
from trainguard.store.status import shown_state

BOOTSTRAP = 2000
LOWER_IS_BETTER = ("loss", "ppl", "perplexity", "error", "err", "wer", "cer", "mse", "mae")


def write_comparison(run_a: Path, run_b: Path, out: Path, warmup: int | None = None, *,
                     repeats_a: Sequence[Path] = (), repeats_b: Sequence[Path] = (), run_noise: float | None = None
                     ) -> tuple[list[Path], dict]:
    from trainguard.folderio import write_atomic

    a, b = load_run(run_a), load_run(run_b)
    result = compare(a, b, warmup=warmup, repeats_a=[load_run(p) for p in repeats_a],
                     repeats_b=[load_run(p) for p in repeats_b], run_noise=run_noise)
    paths = [out / "comparison.json", out / "comparison.md", out / "comparison.html"]
    write_atomic(paths[0], json.dumps(result, indent=2, default=_json_default) + "\n")
    write_atomic(paths[1], render_markdown(result))
    write_atomic(paths[2], render_html(result, a, b))
    return paths, result


def compare(a: RunData, b: RunData, warmup: int | None = None, *, repeats_a: list[RunData] | None = None,
            repeats_b: list[RunData] | None = None, run_noise: float | None = None) -> dict[str, Any]:
    speed_a, speed_b = speed(a, warmup), speed(b, warmup)
    result: dict[str, Any] = {
        "a": _identity(a), "b": _identity(b),
        "speed": {"a": speed_a, "b": speed_b,
                  **speedup(a, b, speed_a, speed_b, warmup, repeats_a=repeats_a or [], repeats_b=repeats_b or [],
                            run_noise=run_noise)},
        "convergence": convergence(a, b),
        "findings": findings_diff(a, b),
    }
    result["headline"] = headline(result)
    return result


def _identity(d: RunData) -> dict[str, Any]:
    return {"run": str(d.run_dir), "name": d.title, "state": shown_state(d.status) if d.status.get("state") else None,
            "steps": d.status.get("step") if d.status.get("step") is not None else d.n_steps,
            "command": " ".join(str(c) for c in (d.meta.get("command") or []))}


# -- speed -------------------------------------------------------------------------------------------


def step_times(d: RunData, warmup: int | None) -> np.ndarray:
    st = d.col("step_time")
    if st is None:
        return np.zeros(0)
    values = st.values[st.present & np.isfinite(st.values) & (st.values > 0)]
    skip = warmup if warmup is not None else max(3, len(values) // 20)
    return values[skip:] if len(values) > skip + 5 else values


def speed(d: RunData, warmup: int | None) -> dict[str, Any]:
    t = step_times(d, warmup)
    if not len(t):
        return {"steps_measured": 0}
    q25, med, q75 = (float(x) for x in np.percentile(t, [25, 50, 75]))
    per_step, unit = samples_per_step(d.meta)
    rate = unit.replace("/s", "") + "_per_s"
    return {"steps_measured": int(len(t)), "median_step_time_s": med, "q25_step_time_s": q25,
            "q75_step_time_s": q75, "iqr_step_time_s": q75 - q25, "mean_step_time_s": float(t.mean()),
            "throughput_unit": unit, f"median_{rate}": per_step / med,
            f"{rate}_iqr": [per_step / q75, per_step / q25]}


# Student's t, two-sided 95%, by degrees of freedom (1-30); 1.96 beyond
T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def speedup(a: RunData, b: RunData, sa: dict, sb: dict, warmup: int | None, *, repeats_a: Sequence[RunData] = (),
            repeats_b: Sequence[RunData] = (), run_noise: float | None = None) -> dict[str, Any]:
    ta, tb = step_times(a, warmup), step_times(b, warmup)
    if not len(ta) or not len(tb):
        return {"speedup": None, "note": "a run has no step times (no probe): speed cannot be compared"}
    rng = np.random.default_rng(0)
    ma = np.median(rng.choice(ta, size=(BOOTSTRAP, len(ta))), axis=1)
    mb = np.median(rng.choice(tb, size=(BOOTSTRAP, len(tb))), axis=1)
    within = [float(x) for x in np.percentile(ma / mb, [2.5, 97.5])]
    # the variance of each run's log median from its own steps: the floor of any run-to-run estimate
    var_within = float(np.var(np.log(ma)) + np.var(np.log(mb))) / 2
    spread = [sa["q25_step_time_s"] / sb["q75_step_time_s"], sa["q75_step_time_s"] / sb["q25_step_time_s"]]
    logs_a = [math.log(sa["median_step_time_s"])] + _log_medians(repeats_a, warmup)
    logs_b = [math.log(sb["median_step_time_s"])] + _log_medians(repeats_b, warmup)
    na, nb = len(logs_a), len(logs_b)
    diff = float(np.mean(logs_a) - np.mean(logs_b))
    value = math.exp(diff)
    df = (na - 1) + (nb - 1)
    noise: dict[str, Any] = {"runs_a": na, "runs_b": nb}
    if df >= 1:
        ss = float(np.sum((np.array(logs_a) - np.mean(logs_a)) ** 2) + np.sum((np.array(logs_b) - np.mean(logs_b)) ** 2))
        var = max(ss / df, var_within)  # two repeats that happen to agree do not make the machine quiet
        half = (T975[df - 1] if df <= len(T975) else 1.96) * math.sqrt(var * (1 / na + 1 / nb))
        noise.update(known=True, how=f"the spread of the repeats ({na} run(s) of A, {nb} of B)", df=df,
                     relative_sd=math.sqrt(var))
    elif run_noise is not None:
        half = 1.96 * math.sqrt(2 * var_within + 2 * run_noise ** 2)
        noise.update(known=True, how=f"--run-noise {run_noise:g} (one run each)", relative_sd=run_noise)
    else:
        half = None
        noise.update(known=False, how="unknown: one run each (repeat the runs with --repeat-a/--repeat-b, or give"
                                      " --run-noise)")
    out = {"speedup": value, "speedup_iqr_range": spread, "speedup_percent": (value - 1) * 100,
           "within_run_ci95": within, "run_to_run": noise}
    if half is None:
        lo, hi = within
        out["speedup_ci95"] = None
        word = ("B looks faster" if lo > 1 else "B looks slower" if hi < 1 else "no difference within the runs")
        out["verdict"] = (f"{word}: {value:.2f}x (within-run 95% interval {lo:.2f}-{hi:.2f}x; the run-to-run"
                          f" variation is unknown with one run each, so this is not yet a measured difference)")
        return out
    lo, hi = math.exp(diff - half), math.exp(diff + half)
    out["speedup_ci95"] = [lo, hi]
    interval = f"95% interval {lo:.2f}-{hi:.2f}x, run-to-run variation included"
    if lo > 1:
        out["verdict"] = f"B is faster: {value:.2f}x ({interval})"
    elif hi < 1:
        out["verdict"] = f"B is slower: {value:.2f}x ({interval})"
    else:
        out["verdict"] = f"no measurable difference: {value:.2f}x ({interval}; it includes 1)"
    return out


def _log_medians(runs: Sequence[RunData], warmup: int | None) -> list[float]:
    out = []
    for d in runs:
        t = step_times(d, warmup)
        if len(t):
            out.append(math.log(float(np.median(t))))
    return out


# -- convergence -------------------------------------------------------------------------------------


def _loss_by_step(d: RunData) -> dict[int, float]:
    loss, steps = d.col("loss"), d.columns.get("step")
    if loss is None or steps is None:
        return {}
    ok = loss.present & np.isfinite(loss.values)
    return dict(zip(steps.values[ok].astype(int).tolist(), loss.values[ok].tolist()))  # last write of a step wins


def convergence(a: RunData, b: RunData) -> dict[str, Any]:
    la, lb = _loss_by_step(a), _loss_by_step(b)
    common = sorted(set(la) & set(lb))
    out: dict[str, Any] = {"common_steps": len(common)}
    rel_tol = 0.02
    if len(common) >= 10:
        window = common[-max(5, len(common) // 10):]
        wa = np.array([la[s] for s in window])
        wb = np.array([lb[s] for s in window])
        noise = float(math.sqrt((wa.var() + wb.var()) / 2))
        fa, fb = float(wa.mean()), float(wb.mean())
        tol = max(noise, 0.01 * abs(fa))
        rel_tol = max(0.02, tol / abs(fa)) if fa else 0.02
        out["loss"] = {"final_window_steps": [window[0], window[-1]], "a": fa, "b": fb, "difference": fb - fa,
                       "noise": noise, "tolerance": tol, "matches": abs(fb - fa) <= tol}
    out["eval"] = _eval_compare(a, b, rel_tol)
    verdicts = [out["loss"]["matches"]] if "loss" in out else []
    verdicts += [m["final_matches"] for m in out["eval"].values() if "final_matches" in m]
    out["matches"] = all(verdicts) if verdicts else None
    out["relative_tolerance"] = rel_tol
    return out


def _evals(d: RunData) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for e in d.events_of("eval"):
        if not isinstance(e["data"], dict) or e["step"] is None:
            continue
        for k, v in e["data"].items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out.setdefault(k, []).append((int(e["step"]), float(v)))
    return out


def _eval_compare(a: RunData, b: RunData, rel_tol: float) -> dict[str, Any]:
    ea, eb = _evals(a), _evals(b)
    out: dict[str, Any] = {}
    for name in sorted(set(ea) | set(eb)):
        if name not in ea or name not in eb:
            out[name] = {"only_in": "a" if name in ea else "b"}
            continue
        lower = any(w in name.lower() for w in LOWER_IS_BETTER)
        best = min if lower else max
        fa, fb = ea[name][-1][1], eb[name][-1][1]
        ba, bb = best(v for _, v in ea[name]), best(v for _, v in eb[name])
        scale = max(abs(fa), 1e-12)
        out[name] = {"lower_is_better": lower, "final_a": fa, "final_b": fb, "final_difference": fb - fa,
                     "best_a": ba, "best_b": bb, "best_difference": bb - ba,
                     "final_matches": abs(fb - fa) / scale <= rel_tol,
                     "steps_a": [s for s, _ in ea[name]], "steps_b": [s for s, _ in eb[name]]}
    return out


# -- findings ----------------------------------------------------------------------------------------


def findings_diff(a: RunData, b: RunData) -> dict[str, list[dict[str, Any]]]:
    def keyed(d: RunData) -> dict[tuple, Any]:
        return {(f.code, f.name): f for f in d.findings}

    ka, kb = keyed(a), keyed(b)

    def brief(f: Any) -> dict[str, Any]:
        return {"code": f.code, "name": f.name, "severity": f.severity, "step": f.step, "summary": f.summary}

    return {"only_a": [brief(ka[k]) for k in ka if k not in kb], "only_b": [brief(kb[k]) for k in kb if k not in ka],
            "both": [brief(ka[k]) for k in ka if k in kb]}


def headline(r: dict[str, Any]) -> str:
    parts = []
    sp = r["speed"]
    parts.append(sp.get("verdict") or sp.get("note") or "speed unknown")
    m = r["convergence"]["matches"]
    parts.append("convergence matches" if m else ("convergence differs" if m is False else "convergence: too few shared steps to tell"))
    f = r["findings"]
    if f["only_a"] or f["only_b"]:
        parts.append(f"findings only in A: {len(f['only_a'])}, only in B: {len(f['only_b'])}")
    return "; ".join(parts)


def unmet(r: dict[str, Any], *, min_speedup: float | None = None, same_convergence: bool = False) -> list[str]:
    """The expectations (seed 000's "speedup >= 25%, convergence similar") this comparison does not meet."""
    out = []
    sp = r["speed"]
    if min_speedup is not None:
        if sp.get("speedup") is None:
            out.append(f"speedup >= {min_speedup:g}x: {sp.get('note', 'no step times')}")
        elif sp.get("speedup_ci95") is None:
            lo, hi = sp["within_run_ci95"]
            out.append(f"speedup >= {min_speedup:g}x: cannot decide on one run each: measured {sp['speedup']:.2f}x"
                       f" (within-run interval {lo:.2f}-{hi:.2f}x) but the run-to-run variation is unknown; repeat"
                       " the runs (--repeat-a/--repeat-b) or give --run-noise")
        elif sp["speedup_ci95"][0] < min_speedup:
            lo, hi = sp["speedup_ci95"]
            out.append(f"speedup >= {min_speedup:g}x: measured {sp['speedup']:.2f}x, 95% interval {lo:.2f}-{hi:.2f}x")
    if same_convergence and r["convergence"]["matches"] is not True:
        why = "differs" if r["convergence"]["matches"] is False else "too few shared steps to tell"
        out.append(f"same convergence: {why}")
    return out


# -- rendering ---------------------------------------------------------------------------------------


def _f(v: Any, digits: int = 4) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.{digits}g}"
    return str(v)


def _speed_rows(r: dict[str, Any]) -> list[tuple[str, str, str]]:
    sa, sb = r["speed"]["a"], r["speed"]["b"]
    rows = [("steps measured", _f(sa.get("steps_measured")), _f(sb.get("steps_measured")))]
    for key, label in (("median_step_time_s", "median step time (s)"), ("iqr_step_time_s", "IQR of step time (s)"),
                       ("mean_step_time_s", "mean step time (s)")):
        rows.append((label, _f(sa.get(key)), _f(sb.get(key))))
    unit = sa.get("throughput_unit") or sb.get("throughput_unit")
    if unit:
        rate = unit.replace("/s", "") + "_per_s"
        rows.append((f"median throughput ({unit})", _f(sa.get(f"median_{rate}")), _f(sb.get(f"median_{rate}"))))
        rows.append((f"throughput IQR ({unit})", " - ".join(_f(x) for x in sa.get(f"{rate}_iqr", [])),
                     " - ".join(_f(x) for x in sb.get(f"{rate}_iqr", []))))
    return rows


def _interval_text(sp: dict[str, Any]) -> str:
    wlo, whi = sp["within_run_ci95"]
    noise = sp.get("run_to_run") or {}
    if sp.get("speedup_ci95") is None:
        return (f"within-run 95% interval {wlo:.3f}-{whi:.3f}x (the steps resampled); run-to-run variation"
                f" {noise.get('how', 'unknown')}")
    lo, hi = sp["speedup_ci95"]
    return (f"95% interval {lo:.3f}-{hi:.3f}x with run-to-run variation (relative sd"
            f" {noise.get('relative_sd', 0):.1%}, from {noise.get('how')}); within the runs alone {wlo:.3f}-{whi:.3f}x")


def render_markdown(r: dict[str, Any]) -> str:
    from trainguard.report.markdown import md

    a, b = r["a"], r["b"]
    out = ["# trainguard comparison", "", f"- A (baseline): {md(a['name'])}, {md(a['state'])}, {a['steps']} steps",
           f"- B: {md(b['name'])}, {md(b['state'])}, {b['steps']} steps", "", f"> {md(r['headline'])}", "",
           "## Speed", "", "| | A | B |", "|---|---|---|"]
    out += [f"| {k} | {x} | {y} |" for k, x, y in _speed_rows(r)]
    sp = r["speed"]
    if sp.get("speedup") is not None:
        qlo, qhi = sp["speedup_iqr_range"]
        out += ["", f"Speedup (median A / median B): **{sp['speedup']:.3f}x** ({sp['speedup_percent']:+.1f}%), "
                    f"{md(_interval_text(sp))}; from the IQRs, {qlo:.3f}-{qhi:.3f}x."]
    elif sp.get("note"):
        out += ["", md(sp["note"])]
    c = r["convergence"]
    out += ["", "## Convergence", "", f"Shared steps: {c['common_steps']}. "
            + ("Matches." if c["matches"] else ("Differs." if c["matches"] is False else "Too few shared steps to tell."))]
    if "loss" in c:
        lo_ = c["loss"]
        out += ["", "| training loss, last 10% of shared steps | A | B | difference | tolerance (noise) | matches |",
                "|---|---|---|---|---|---|",
                f"| steps {lo_['final_window_steps'][0]}-{lo_['final_window_steps'][1]} | {_f(lo_['a'])} | {_f(lo_['b'])} "
                f"| {_f(lo_['difference'])} | {_f(lo_['tolerance'])} | {_f(lo_['matches'])} |"]
    if c["eval"]:
        out += ["", "| eval metric | final A | final B | difference | best A | best B | difference | final matches |",
                "|---|---|---|---|---|---|---|---|"]
        for name, m in c["eval"].items():
            if "only_in" in m:
                out.append(f"| {md(name)} | only in run {m['only_in'].upper()} | | | | | | |")
                continue
            out.append(f"| {md(name)} | {_f(m['final_a'])} | {_f(m['final_b'])} | {_f(m['final_difference'])} | "
                       f"{_f(m['best_a'])} | {_f(m['best_b'])} | {_f(m['best_difference'])} | {_f(m['final_matches'])} |")
    f = r["findings"]
    out += ["", "## Findings", ""]
    for key, label in (("only_a", "Only in A"), ("only_b", "Only in B"), ("both", "In both")):
        out.append(f"{label}: " + (", ".join(f"{md(x['code'])} {md(x['name'])}" + (f" (step {x['step']})" if x["step"] is not None else "")
                                             for x in f[key]) or "none"))
        out.append("")
    return "\n".join(out)


def render_html(r: dict[str, Any], a: RunData, b: RunData) -> str:
    from trainguard.report.html import page

    body = ["<h1>trainguard comparison</h1>",
            f"<p>A (baseline): <b>{esc(r['a']['name'])}</b> ({esc(r['a']['state'])}, {esc(r['a']['steps'])} steps)<br>"
            f"B: <b>{esc(r['b']['name'])}</b> ({esc(r['b']['state'])}, {esc(r['b']['steps'])} steps)</p>",
            f'<p class="headline" id="headline">{esc(r["headline"])}</p>', "<h2>Speed</h2><table><tr><th></th><th>A</th><th>B</th></tr>"]
    body += [f"<tr><th>{esc(k)}</th><td>{esc(x)}</td><td>{esc(y)}</td></tr>" for k, x, y in _speed_rows(r)]
    body.append("</table>")
    sp = r["speed"]
    if sp.get("speedup") is not None:
        body.append(f"<p>Speedup (median A / median B): <b>{sp['speedup']:.3f}x</b> ({sp['speedup_percent']:+.1f}%), "
                    f"{esc(_interval_text(sp))}.</p>")
    plots = []
    for key, title, col in (("step_time", "Step time (s)", "step_time"), ("loss", "Training loss", "loss")):
        series = []
        for label, d in (("A", a), ("B", b)):
            c, steps = d.col(col), d.columns.get("step")
            if c is not None and steps is not None:
                s = downsample(f"{label}: {d.title}", steps.values, c.values, c.present)
                s.dashed = label == "B"
                series.append(s)
        if series:
            plots.append(Plot(key, title, series, y_label=col))
    ea, eb = _evals(a), _evals(b)
    for name in sorted(set(ea) & set(eb)):
        series = []
        for label, ev in (("A", ea), ("B", eb)):
            s = downsample(f"{label} eval {name}", np.array([p[0] for p in ev[name]], float),
                           np.array([p[1] for p in ev[name]], float))
            s.dashed = label == "B"
            series.append(s)
        plots.append(Plot(f"eval-{name}", f"Evaluation: {name}", series, y_label=name, log_y=False))
    c = r["convergence"]
    body.append("<h2>Convergence</h2>")
    body.append(f"<p>Shared steps: {esc(c['common_steps'])}. "
                + ("Convergence matches." if c["matches"] else ("Convergence differs." if c["matches"] is False else "Too few shared steps to tell.")) + "</p>")
    if "loss" in c:
        lo_ = c["loss"]
        body.append("<table><tr><th>training loss, last 10% of shared steps</th><th>A</th><th>B</th><th>difference</th>"
                    "<th>tolerance (noise)</th><th>matches</th></tr>"
                    f"<tr><td>steps {esc(lo_['final_window_steps'][0])}-{esc(lo_['final_window_steps'][1])}</td>"
                    f"<td>{esc(_f(lo_['a']))}</td><td>{esc(_f(lo_['b']))}</td><td>{esc(_f(lo_['difference']))}</td>"
                    f"<td>{esc(_f(lo_['tolerance']))}</td><td>{esc(_f(lo_['matches']))}</td></tr></table>")
    if c["eval"]:
        body.append("<table><tr><th>eval metric</th><th>final A</th><th>final B</th><th>difference</th><th>best A</th>"
                    "<th>best B</th><th>difference</th><th>final matches</th></tr>")
        for name, m in c["eval"].items():
            if "only_in" in m:
                body.append(f"<tr><td>{esc(name)}</td><td colspan=7>only in run {esc(m['only_in'].upper())}</td></tr>")
                continue
            cells = [m["final_a"], m["final_b"], m["final_difference"], m["best_a"], m["best_b"], m["best_difference"],
                     m["final_matches"]]
            body.append(f"<tr><td>{esc(name)}</td>" + "".join(f"<td>{esc(_f(x))}</td>" for x in cells) + "</tr>")
        body.append("</table>")
    for p in plots:
        body.append(f'<figure id="plot-{esc(p.key)}"><figcaption>{esc(p.title)}</figcaption>{render(p)}</figure>')
    f = r["findings"]
    body.append("<h2>Findings</h2>")
    for key, label in (("only_a", "Only in A"), ("only_b", "Only in B"), ("both", "In both")):
        items = "".join(f"<li>{esc(x['code'])} {esc(x['name'])} [{esc(x['severity'])}]"
                        + (f" at step {esc(x['step'])}" if x["step"] is not None else "") + f": {esc(x['summary'])}</li>"
                        for x in f[key])
        body.append(f"<h3>{label}</h3>" + (f"<ul>{items}</ul>" if items else "<p>none</p>"))
    return page("trainguard comparison", body)


def _json_default(v: Any) -> Any:
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    if isinstance(v, np.bool_):
        return bool(v)
    return str(v)
