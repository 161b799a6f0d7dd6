"""The canary's report: Markdown and HTML (for the KFP UI, with each limit's interval plotted as the gate's) of a
CanaryResult, and its one-line summary."""

from __future__ import annotations

import html
import tempfile
from dataclasses import fields
from pathlib import Path

from components.release.effect_plot import PLOT_FILE, embedded_image, plot
from components.release.effects import Effect
from components.release.promote.records import CanaryResult, PromoteResult
from components.release.promote.settings import SUMMARY_WINDOW_S

ROUND_HEADER = (
    "round",
    "counted",
    "canary req",
    "failed",
    "mean ms",
    "p99 ms",
    "stable req",
    "failed",
    "mean ms",
    "p99 ms",
)


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary(result: CanaryResult) -> str:
    """For example "canary pass after 5 of 5 rounds (31 s): mean latency +1.2% [-3.0, +5.1] (limit +10%): within"."""
    if result.decision == "skipped":
        return f"canary skipped: {'; '.join(result.reasons)}"
    rounds = f"{result.counted_rounds} counted of {len(result.rounds)} rounds"
    return f"canary {result.decision} after {rounds} ({result.seconds:.0f} s): {'; '.join(result.reasons)}"


def round_rows(result: CanaryResult) -> list[tuple[str, ...]]:
    """The rounds before the switch ("before 1", ...: both sides on stable), then those after it (1, 2, ...)."""
    labelled = [(f"before {i}", r) for i, r in enumerate(result.calibration, 1)]
    labelled += [(str(i), r) for i, r in enumerate(result.rounds, 1)]
    rows = []
    for label, r in labelled:
        rows.append(
            (
                label,
                "yes" if r.counted else f"no: {r.note}",
                *(
                    cell
                    for s in (r.canary, r.baseline)
                    for cell in (str(s.requests), str(s.failures), _fmt(s.mean_ms, ".3f"), _fmt(s.p99_ms, ".3f"))
                ),
            )
        )
    return rows


def _how(result: CanaryResult) -> str:
    s = result.settings
    p99 = (
        "p99 decides (rounds as long as Triton's 60 s summary window)"
        if s.get("round_s", 0) >= SUMMARY_WINDOW_S
        else "p99 reported only (rounds shorter than Triton's 60 s summary window overlap)"
    )
    return (
        f"Canary {', '.join(result.canary_replicas) or '-'} against stable {', '.join(result.baseline_replicas) or '-'} "
        f"on live traffic, rounds of {s.get('round_s', 0):g} s, at least {s.get('min_requests', 0)} requests a side; "
        f"relative effects are the change from the {len(result.calibration)} rounds before the switch (both sides on "
        f"stable) to those after it; {p99}. {result.stopped or ''} Outcome: {result.outcome or '-'}."
    )


def markdown(result: CanaryResult) -> str:
    lines = [
        f"# Canary: {result.model} v{result.version} against v{result.stable_version} — **{result.decision.upper()}**",
        "",
        _how(result),
        "",
        *[f"- {reason}" for reason in result.reasons],
    ]
    if result.calibration or result.rounds:
        lines += ["", f"| {' | '.join(ROUND_HEADER)} |", "|" + " --- |" * len(ROUND_HEADER)]
        lines += [f"| {' | '.join(row)} |" for row in round_rows(result)]
    return "\n".join(lines) + "\n"


def html_page(result: CanaryResult, png: Path | None) -> str:
    colour = {"pass": "#1a7f37", "fail": "#cf222e"}.get(result.decision, "#9a6700")
    header = "".join(f"<th>{html.escape(h)}</th>" for h in ROUND_HEADER)
    rows = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in round_rows(result))
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in result.reasons)
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>canary report</title>"
        "<style>body{font-family:sans-serif;max-width:900px;margin:2em}td,th{padding:2px 8px;text-align:right}"
        "</style></head><body>"
        f"<h1>Canary: {html.escape(result.model)} v{result.version}: "
        f"<span style='color:{colour}'>{result.decision.upper()}</span></h1>"
        f"<p>{html.escape(_how(result))}</p><ul>{reasons}</ul>{embedded_image(png)}"
        f"<table><tr>{header}</tr>{rows}</table></body></html>"
    )


def pages(result: CanaryResult | None, plot_dir: Path | None = None) -> tuple[str, str]:
    """report.md's and report.html's text, each limit's interval plotted into the page: what the CLI's --out and the
    pipeline's promote task both show. The plot's PNG is left in `plot_dir` where one is given. No result: the
    canary did not run (the pipeline's task has its reports either way)."""
    if result is None:
        return "# Canary: not run\n", "<p>Canary: not run</p>"
    with tempfile.TemporaryDirectory(prefix="tritonship-canary-") as tmp:
        png = (plot_dir or Path(tmp)) / PLOT_FILE
        effects = [Effect(**{f.name: e[f.name] for f in fields(Effect)}) for e in result.effects]
        has_plot = plot(effects, f"canary of {result.model} v{result.version}: {result.decision}", png)
        return markdown(result), html_page(result, png if has_plot else None)


def write(result: CanaryResult, out_dir: Path | None) -> None:
    """report.md, report.html and the plot into `out_dir` (nothing without one)."""
    if out_dir is None:
        return
    out_dir.mkdir(parents=True, exist_ok=True)
    text, page = pages(result, out_dir)
    (out_dir / "report.md").write_text(text)
    (out_dir / "report.html").write_text(page)


def reverted_by_canary(result: PromoteResult) -> str:
    """What a person reads when the canary reverted a promotion: its decision (the first problem) and the version
    every replica serves again."""
    return f"{result.problems[0]} Every replica was reverted to {result.stable}."
