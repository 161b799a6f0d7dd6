"""The quality check's report: each metric for both versions, overall and per slice, the paired difference with its
interval, each limit's effect with a plot, and the one-line summary the CLI prints. The gate's report embeds it."""

from __future__ import annotations

import html
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path

from components.release.effect_plot import embedded_image, plot
from components.release.effects import Effect
from components.release.results import QualityResult

PLOT_FILE = "quality.png"
HEADER = ("metric", "slice", "rows", "candidate", "stable", "candidate − stable [interval]")


def effects(result: QualityResult) -> list[Effect]:
    """The judged limits as Effects again (the JSON keeps their fields)."""
    return [Effect(**{f.name: e[f.name] for f in fields(Effect)}) for e in result.effects]


def _value(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def rows(result: QualityResult) -> list[tuple[str, ...]]:
    out = []
    for m in result.metrics:
        if "problem" in m:
            out.append((m["metric"], m["slice"] or "all", "-", m["problem"], "", ""))
            continue
        change = "-"
        if m.get("difference") is not None:
            low, high = m["difference_interval"]
            change = f"{m['difference']:+.4f} [{low:+.4f}, {high:+.4f}]"
        out.append(
            (m["metric"], m["slice"] or "all", f"{m['rows']:,}", _value(m["candidate"]), _value(m["stable"]), change)
        )
    return out


def summary(result: QualityResult) -> str:
    """One line: the decision, and each judged limit's figure."""
    judged = "; ".join(e["text"] for e in result.effects) or "; ".join(result.reasons)
    stable = f"v{result.stable_version}" if result.stable_version is not None else "no stable version"
    return f"quality {result.decision} on {result.rows:,} rows against {stable}: {judged}"


def _unsaid(result: QualityResult, said: Sequence[str]) -> tuple[list[str], list[str]]:
    """The reasons, and the "more rows would decide" notes, that neither another reason nor `said` (what the page
    holding this section says already: the gate's report gives a failed check's reasons) gives."""
    reasons = [r for r in result.reasons if not any(r in s for s in said)]
    more = [
        f"{e['name']}: about {e['more_rows']:,} more rows would decide"
        for e in result.effects
        if e.get("more_rows") and not any(e["text"] in s for s in [*result.reasons, *said])
    ]
    return reasons, more


def calibration_note(result: QualityResult) -> str:
    """Where metrics without limits of their own took theirs from, when a quality calibration gave them."""
    found = result.calibration
    if found is None:
        return ""
    drops = ", ".join(f"{name} {v.max_drop_pct:g}%" for name, v in found.metrics.items())
    return (
        f" Metrics without limits of their own may drop as much as {len(found.versions)} retrains of the model "
        f"differ (quality calibration of {found.recorded or 'earlier'}; the default where it is wider): {drops}."
    )


def markdown_lines(result: QualityResult, said: Sequence[str] = ()) -> list[str]:
    stable = f"v{result.stable_version}" if result.stable_version is not None else "none (first release)"
    reasons, more = _unsaid(result, said)
    lines = [
        f"## Quality: **{result.decision.upper()}**",
        "",
        f"{result.rows:,} labelled rows of {result.eval_data}, sent to the candidate and to stable ({stable}) on the "
        f"gate; intervals at {result.confidence:.0%}; {result.seconds:.1f} s.{calibration_note(result)}",
        "",
        *[f"- {reason}" for reason in reasons],
        "",
        f"| {' | '.join(HEADER)} |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
        *[f"| {' | '.join(row)} |" for row in rows(result)],
    ]
    if more:
        lines += ["", *[f"- {note}" for note in more]]
    return lines


def html_section(result: QualityResult, image: str, said: Sequence[str] = ()) -> str:
    colour = {"pass": "#1a7f37", "fail": "#cf222e"}.get(result.decision, "#9a6700")
    header = "".join(f"<th>{html.escape(h)}</th>" for h in HEADER)
    table = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows(result))
    reasons, more = _unsaid(result, said)
    listed = "".join(f"<li>{html.escape(r)}</li>" for r in reasons + more)
    return (
        f"<h2>Quality: <span style='color:{colour}'>{result.decision.upper()}</span></h2>"
        f"<p>{result.rows:,} labelled rows of {html.escape(result.eval_data)}; intervals at "
        f"{result.confidence:.0%}.{html.escape(calibration_note(result))}</p><ul>{listed}</ul>{image}<table><tr>{header}</tr>{table}</table>"
    )


def write(result: QualityResult, out_dir: Path) -> None:
    """quality.json, quality.md, quality.html and the plot in `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    png = out_dir / PLOT_FILE
    has_plot = plot(effects(result), f"{result.model} v{result.version}: quality {result.decision}", png)
    (out_dir / "quality.json").write_text(result.to_json())
    (out_dir / "quality.md").write_text("\n".join(markdown_lines(result)) + "\n")
    page = html_section(result, embedded_image(png if has_plot else None))
    (out_dir / "quality.html").write_text(
        f"<!doctype html><html><head><meta charset='utf-8'><title>quality report</title></head><body>{page}</body></html>"
    )
