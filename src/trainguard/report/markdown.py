"""report.md: the report as Markdown, for terminals (`trainguard report --print`), chats and tickets.

Strings from the run are escaped (backslash before Markdown's active characters), so a metric named
`[x](javascript:...)` or `<img ...>` stays text in any renderer; raw lines go in fences longer than any
backtick run they contain. Control characters (terminal escapes) are written as visible escapes, so
`cat report.md` cannot drive a terminal either.
"""

from __future__ import annotations

import re

from trainguard.report.build import Report, clock, elapsed, evidence_rows, fmt_duration
from trainguard.report.svg import Plot
from trainguard.store.acks import read_acks
from trainguard.store.ending import how_it_exited
from trainguard.untrusted import printable

_ACTIVE = re.compile(r"([\\`*\[\]<>|#&!])")


def md(text: object) -> str:
    """Inline text from the run, made inert: one line, Markdown's active characters escaped."""
    return _ACTIVE.sub(r"\\\1", " ".join(printable(text).split()))


def fence(lines: list[str], lang: str = "") -> list[str]:
    longest = max((len(m) for line in lines for m in re.findall(r"`+", line)), default=0)
    bar = "`" * max(3, longest + 1)
    return [bar + lang, *(printable(line) for line in lines), bar]


def render_markdown(r: Report) -> str:
    v = r.verdict
    out = [f"# trainguard report: {md(r.title)}", ""]
    facts = [f"**state: {md(v.state)}**", f"**health: {md(v.health)}**"]
    how = how_it_exited(v.state if v.ended else None, v.exit_code, v.signal)  # a live hung run is not stopped yet
    if how:
        facts.append(md(f"signal {how}" if how == v.signal else how))
    facts.append(f"duration {fmt_duration(v.duration)}")
    if v.steps_done is not None:
        facts.append(f"steps {v.steps_done}" + (f" of {v.steps_planned} planned" if v.steps_planned else ""))
    if v.started:
        facts.append(f"started {clock(v.started)}")
    out += [" · ".join(facts), "", f"> {md(v.headline)}", ""]

    if r.numbers:
        out += ["## Key numbers", "", "| | |", "|---|---|"] + [f"| {md(k)} | {md(val)} |" for k, val in r.numbers] + [""]
    out += ["## Timeline", "", "| time | elapsed | step | attempt | what |", "|---|---|---|---|---|"]
    for row in r.timeline:
        when = clock(row.t)[11:19] if row.t else ""
        out.append(f"| {when} | {elapsed(row.t, v.started)} | {'' if row.step is None else md(row.step)} | "
                   f"{md(row.attempt)} | {md(row.what)} |")
    out.append("")

    out += [f"## Findings ({len(r.findings)})", ""]
    if not r.findings:
        out += ["None. See what was checked below.", ""]
    acks = read_acks(r.run_dir)
    for i, f in enumerate(r.findings, 1):
        at = f" at step {md(f.step)}" if f.step is not None else ""
        out += [f"### {i}. {md(f.code)} {md(f.name)} [{md(f.severity)}]{at}", "", md(f.summary), ""]
        if f.code in acks:
            ack = acks[f.code]
            out += [f"*acknowledged by {md(ack['by'])}*" + (f": {md(ack['why'])}" if ack["why"] else ""), ""]
        for label, value in (("cause", f.cause), ("where", f.where), ("exception", f.exception), ("source", f.source)):
            if value:
                out.append(f"- {label}: {md(value)}")
        out.append("")
        rows = evidence_rows(f.evidence)
        values = [(k, t) for k, kind, t in rows if kind == "value" and k not in ("exception", "where", "cause")]
        if values:
            out += ["| evidence | value |", "|---|---|"] + [f"| {md(k)} | {md(t)} |" for k, t in values] + [""]
        for k, kind, lines in rows:
            if kind == "block":
                out += [f"{md(k)}:", ""] + fence([str(x) for x in lines]) + [""]
        if f.fix:
            out += [f"**Fix:** {md(f.fix)}", ""]
        out += [f"The rule's page: `trainguard rules {f.code.replace('`', '')}`", ""]

    if r.stacks:
        out += ["## Stacks taken by the watchdog", ""]
        for name, text in r.stacks:
            out += [f"{md(name)}:", ""] + fence(text.splitlines()[:120]) + [""]

    out += ["## Plots", "", "The curves are in report.html (next to this file); their numbers:", ""]
    out += ["| plot | series | first | last | min | max | NaN/inf steps |", "|---|---|---|---|---|---|---|"]
    for p in r.plots:
        out += _plot_rows(p)
    out.append("")

    out += ["## What was checked", "", "| code | rule | family | result | detail |", "|---|---|---|---|---|"]
    for c in r.checks:
        out.append(f"| {md(c.code)} | {md(c.name)} | {md(c.family)} | {md(c.result)} | {md(c.detail)} |")
    out.append("")

    out += ["## Environment", "", "| | |", "|---|---|"]
    out += [f"| {md(k)} | {md(val)} |" for k, val in r.environment]
    out.append("")
    if r.output_tail:
        out += [f"## Output (last {len(r.output_tail)} lines of output.log)", ""] + fence(r.output_tail) + [""]
    return "\n".join(out)


def _plot_rows(p: Plot) -> list[str]:
    rows = []
    for s in p.series:
        bad = len(s.nan_x) + len(s.inf_x)
        if len(s.y):
            first, last, lo, hi = (f"{s.y[0]:.4g}", f"{s.y[-1]:.4g}", f"{s.y.min():.4g}", f"{s.y.max():.4g}")
        else:
            first = last = lo = hi = ""
        where = ", ".join(f"{x:g}" for x in list(s.nan_x[:3]) + list(s.inf_x[:3]))
        rows.append(f"| {md(p.title)} | {md(s.name)} | {first} | {last} | {lo} | {hi} | "
                    f"{(str(bad) + ' (first at ' + where + ')') if bad else ''} |")
    return rows
