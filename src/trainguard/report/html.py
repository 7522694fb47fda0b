"""report.html: one self-contained page (inline CSS and SVG; no script, font, image or network fetch).

Safety: every string from the run goes through `esc` (html.escape, quotes included) before it reaches
the page, and a Content-Security-Policy allows no script at all, so a stray tag would be inert twice.
"""

from __future__ import annotations

from trainguard.findings import Finding
from trainguard.report.build import Report, clock, elapsed, evidence_rows, fmt_duration
from trainguard.report.svg import SEVERITY_COLORS, esc, render
from trainguard.store.acks import read_acks
from trainguard.store.ending import how_it_exited

CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
STATE_COLORS = {"completed": "#2ca02c", "running": "#1f77b4", "failed": "#d62728", "crashed": "#d62728",
                "hung": "#d62728", "killed": "#d62728",
                "cut-off": "#e08a00"}
HEALTH_COLORS = {"ok": "#2ca02c", "warning": "#e08a00", "error": "#d62728"}

STYLE = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:0;color:#222;background:#f6f7f9}
main{max-width:1000px;margin:0 auto;padding:18px 24px 60px}
h1{font-size:22px;margin:8px 0}h2{font-size:18px;margin:28px 0 10px;border-bottom:1px solid #ddd;padding-bottom:4px}
h3{font-size:15px;margin:0 0 6px}
.badge{display:inline-block;color:#fff;border-radius:4px;padding:2px 10px;font-weight:600}
.facts span{margin-right:16px}.headline{background:#fff;border-left:4px solid #888;padding:8px 12px;margin:10px 0}
table{border-collapse:collapse;width:100%;background:#fff;margin:6px 0}
td,th{border:1px solid #e3e3e3;padding:3px 7px;text-align:left;vertical-align:top}th{background:#f0f1f3}
td.num{white-space:nowrap;font-variant-numeric:tabular-nums}
.finding{background:#fff;border:1px solid #ddd;border-left:6px solid #888;border-radius:4px;padding:10px 14px;margin:12px 0}
.finding .fix{background:#f3f8f3;padding:6px 10px;border-radius:3px}
pre{background:#1e1e1e;color:#eee;padding:8px 10px;border-radius:4px;overflow:auto;font-size:12px;max-height:420px;white-space:pre-wrap;overflow-wrap:anywhere}
figure{background:#fff;border:1px solid #ddd;border-radius:4px;margin:12px 0;padding:8px}
figcaption{font-weight:600;margin:2px 4px 4px}.note{color:#666;font-size:12px;margin:2px 4px}
svg .tick{font-size:11px;fill:#555}svg .axis-label{font-size:12px;fill:#333}svg .legend{font-size:12px;fill:#222}
svg .mark-label{font-size:11px;font-weight:600}
.r-found{color:#d62728;font-weight:600}.r-passed{color:#2ca02c}.r-not{color:#888}
nav{margin:6px 0 0;font-size:13px}nav a{color:#1f5fa8}
.kind-finding td{background:#fff4f4}.kind-crash td{background:#fff4f4}.kind-run td{font-weight:600}
"""


def page(title: str, body: list[str]) -> str:
    return "".join([
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{STYLE}</style></head><body><main>",
        *body,
        "</main></body></html>\n",
    ])


def render_html(r: Report) -> str:
    v = r.verdict
    color = STATE_COLORS.get(v.state, "#555")
    if v.health != "ok" and v.state in ("completed", "running", "passed"):
        color = HEALTH_COLORS[v.health]  # never a green badge on a run with errors
    b = [f"<h1>trainguard report: {esc(r.title)}</h1>",
         f'<div class="facts" id="verdict"><span class="badge state" style="background:{color}">{esc(v.state)}</span>'
         f'<span class="badge health" style="background:{HEALTH_COLORS.get(v.health, "#555")}">'
         f'health: {esc(v.health)}</span>']
    how = how_it_exited(v.state if v.ended else None, v.exit_code, v.signal)  # a live hung run is not stopped yet
    if how:
        b.append(f"<span>{esc(f'signal {how}' if how == v.signal else how)}</span>")
    b.append(f"<span>duration {esc(fmt_duration(v.duration))}</span>")
    if v.steps_done is not None:
        planned = f" of {esc(v.steps_planned)} planned" if v.steps_planned else ""
        b.append(f"<span>steps {esc(v.steps_done)}{planned}</span>")
    if v.started:
        b.append(f"<span>started {esc(clock(v.started))}</span>")
    b.append(f'</div><p class="headline">{esc(v.headline)}</p>')
    b.append('<nav><a href="#findings">findings</a> · <a href="#plots">plots</a> · <a href="#timeline">timeline</a>'
             ' · <a href="#checks">what was checked</a> · <a href="#environment">environment</a>'
             + (' · <a href="#output">output</a>' if r.output_tail else "") + "</nav>")

    if r.numbers:
        b.append('<h2 id="numbers">Key numbers</h2><table>')
        b += [f"<tr><th>{esc(k)}</th><td>{esc(val)}</td></tr>" for k, val in r.numbers]
        b.append("</table>")
    b.append(f'<h2 id="findings">Findings ({len(r.findings)})</h2>')
    if not r.findings:
        b.append("<p>None. What was checked is listed below.</p>")
    acks = read_acks(r.run_dir)
    for f in r.findings:
        b.append(_finding(f, acks.get(f.code)))
    if r.stacks:
        b.append('<h2 id="stacks">Stacks taken by the watchdog</h2>')
        for name, text in r.stacks:
            b.append(f"<h3>{esc(name)}</h3><pre>{esc(text)}</pre>")

    b.append('<h2 id="plots">Plots</h2>')
    if not r.plots:
        b.append("<p>This run recorded no per-step numbers (no probe), so there is nothing to plot.</p>")
    else:
        b.append('<p class="note">Dashed vertical lines: findings (hover for the summary) and the planned end. '
                 "Red triangles on the top edge: NaN or inf values at that step.</p>")
    for p in r.plots:
        note = f'<p class="note">{esc(p.note)}</p>' if p.note else ""
        b.append(f'<figure id="plot-{esc(p.key)}"><figcaption>{esc(p.title)}</figcaption>{render(p)}{note}</figure>')

    b.append('<h2 id="timeline">Timeline</h2><table><tr><th>time (UTC)</th><th>elapsed</th><th>step</th>'
             "<th>attempt</th><th>what</th></tr>")
    for row in r.timeline:
        when = clock(row.t)[11:19] if row.t else ""
        b.append(f'<tr class="kind-{esc(row.kind)}"><td class="num">{esc(when)}</td>'
                 f'<td class="num">{esc(elapsed(row.t, v.started))}</td>'
                 f'<td class="num">{"" if row.step is None else esc(row.step)}</td><td class="num">{esc(row.attempt)}</td>'
                 f"<td>{esc(row.what)}</td></tr>")
    b.append("</table>")

    b.append('<h2 id="checks">What was checked</h2><table><tr><th>code</th><th>rule</th><th>family</th>'
             "<th>result</th><th>detail</th></tr>")
    for c in r.checks:
        cls = {"found": "r-found", "passed": "r-passed"}.get(c.result, "r-not")
        b.append(f"<tr><td>{esc(c.code)}</td><td>{esc(c.name)}</td><td>{esc(c.family)}</td>"
                 f'<td class="{cls}">{esc(c.result)}</td><td>{esc(c.detail)}</td></tr>')
    b.append("</table>")

    b.append('<h2 id="environment">Environment</h2><table>')
    b += [f"<tr><th>{esc(k)}</th><td>{esc(val)}</td></tr>" for k, val in r.environment]
    b.append("</table>")
    if r.output_tail:
        b.append(f'<h2 id="output">Output (last {len(r.output_tail)} lines of output.log)</h2>'
                 f"<pre>{esc(chr(10).join(r.output_tail))}</pre>")
    return page(f"trainguard report: {r.title}", b)


def _finding(f: Finding, ack: dict | None = None) -> str:
    color = SEVERITY_COLORS.get(f.severity, "#888")
    at = f" at step {esc(f.step)}" if f.step is not None else ""
    out = [f'<div class="finding sev-{esc(f.severity)}" data-code="{esc(f.code)}" '
           f'data-step="{"" if f.step is None else esc(f.step)}" style="border-left-color:{color}">',
           f"<h3>{esc(f.code)} {esc(f.name)} <span style=\"color:{color}\">[{esc(f.severity)}]</span>{at}</h3>",
           f"<p>{esc(f.summary)}</p>"]
    if ack is not None:  # `trainguard ack`: known and accepted, outside the run's health
        out.append(f"<p><em>acknowledged by {esc(ack['by'])}</em>" + (f": {esc(ack['why'])}" if ack["why"] else "")
                   + "</p>")
    facts = [(k, val) for k, val in (("cause", f.cause), ("where", f.where), ("exception", f.exception),
                                     ("source", f.source)) if val]
    rows = evidence_rows(f.evidence)
    shown = {k for k, _ in facts}
    values = [(k, t) for k, kind, t in rows if kind == "value" and k not in shown]
    if facts or values:
        out.append("<table>")
        out += [f"<tr><th>{esc(k)}</th><td>{esc(val)}</td></tr>" for k, val in facts + values]
        out.append("</table>")
    for k, kind, lines in rows:
        if kind == "block":
            out.append(f"<div>{esc(k)}:</div><pre>{esc(chr(10).join(str(x) for x in lines))}</pre>")
    if f.fix:
        out.append(f'<p class="fix"><b>Fix:</b> {esc(f.fix)}</p>')
    out.append(f'<p class="note">The rule\'s page: <code>trainguard rules {esc(f.code)}</code></p>')
    out.append("</div>")
    return "".join(out)
