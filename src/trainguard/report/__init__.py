"""The report: the post-mortem a run writes about itself, and the comparison of two runs.

    trainguard report RUN [--print]        report.md and report.html in the run folder
    trainguard compare RUN_A RUN_B          comparison.json/.md/.html

`write_report` is what `trainguard run` calls at the end of every run (fail-open: a report that cannot
be written never changes the run's verdict).
"""

from __future__ import annotations

from pathlib import Path

from trainguard.folderio import write_atomic


def write_report(run_dir: str | Path) -> tuple[Path, Path]:
    """Writes report.md and report.html into the run folder; returns their paths."""
    from trainguard.report.build import build_report
    from trainguard.report.html import render_html
    from trainguard.report.markdown import render_markdown

    report = build_report(run_dir)
    run_dir = Path(run_dir)
    md_path, html_path = run_dir / "report.md", run_dir / "report.html"
    write_atomic(md_path, render_markdown(report))
    write_atomic(html_path, render_html(report))
    return md_path, html_path
