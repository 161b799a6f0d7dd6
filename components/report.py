"""The gate report: Markdown and HTML (with a latency-throughput plot) of a gate result."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from components.gate import Figures, GateResult

PLOT_FILE = "latency_throughput.png"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def rows(result: GateResult) -> list[tuple[str, str, str, str, str]]:
    """(what, round, throughput, p50, p99) rows for both models."""
    out = []
    for label, figures in (("candidate", result.candidate), ("stable", result.stable)):
        for i, (tp, p50, p99) in enumerate(zip(figures.throughput, figures.p50_ms, figures.p99_ms, strict=True)):
            out.append((label, str(i + 1), f"{tp:,.0f}", f"{p50:.3f}", f"{p99:.3f}"))
        if figures.throughput:
            total = figures.summary()  # throughput: median of the rounds; latencies: all requests pooled
            out.append(
                (label, "all", f"{total['throughput']:,.0f}", f"{total['p50_ms']:.3f}", f"{total['p99_ms']:.3f}")
            )
    return out


TUNING_HEADER = ("instances", "max batch", "queue delay µs", "preferred", "infer/s", "p99 ms", "")


def tuning_rows(tuning: dict[str, Any] | None) -> list[tuple[str, ...]]:
    """One row per setting the tune step measured (TuneResult's JSON), the chosen one marked."""
    if not tuning:
        return []
    chosen = tuning["chosen"]
    out = []
    for trial in tuning["trials"]:
        settings = {k: trial[k] for k in chosen}
        note = "chosen" if settings == chosen else trial["problem"]
        if settings == tuning["default"]:
            note = f"default{', ' + note if note else ''}"
        out.append((
            str(trial["instance_count"]), str(trial["max_batch_size"] or "-"),
            str(trial["max_queue_delay_us"]) if trial["dynamic_batching"] else "off",
            ",".join(map(str, trial["preferred_batch_sizes"])) or "-",
            _fmt(trial["throughput"], ",.0f"), _fmt(trial["p99_ms"], ".3f"), note,
        ))  # fmt: skip
    return out


def tuning_markdown(t: dict[str, Any] | None) -> list[str]:
    if not t:
        return []
    gain = "-" if t["gain_pct"] is None else f"{t['gain_pct']:+.1f}%"
    return [
        "",
        f"## Serving settings: {t['settings_measured']} of {t['grid_size']} measured, throughput {gain} over "
        f"the default within p99 {_fmt(t['p99_limit_ms'], '.3f')} ms",
        "",
        f"| {' | '.join(TUNING_HEADER)} |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        *[f"| {' | '.join(row)} |" for row in tuning_rows(t)],
    ]


def markdown(result: GateResult) -> str:
    stable = f"v{result.stable_version}" if result.stable_version is not None else "none (first release)"
    load = result.settings.get("load", {})
    lines = [
        f"# Gate: {result.model} v{result.version} — **{result.verdict.upper()}**",
        "",
        f"Stable: {stable}. Load: concurrency {load.get('concurrency')}"
        f"{', request rate ' + str(load.get('request_rate')) if load.get('request_rate') else ''}, "
        f"window {load.get('window_ms')} ms, {result.settings.get('rounds')} rounds, "
        f"{result.measurement_seconds:.1f} s of measurement.",
        "",
        *[f"- {reason}" for reason in result.reasons],
        "",
        f"p99 regression: {_fmt(result.p99_regression_pct, '+.1f')}% · throughput drop: "
        f"{_fmt(result.throughput_regression_pct, '.1f')}% · round spread: {_fmt(result.noise_pct, '.1f')}%",
        "",
        "| model | round | infer/s | p50 ms | p99 ms |",
        "| --- | --- | ---: | ---: | ---: |",
        *[f"| {' | '.join(row)} |" for row in rows(result)],
        "",
        f"Thresholds: {result.settings.get('thresholds')}",
        *tuning_markdown(result.tuning),
    ]
    return "\n".join(lines) + "\n"


def plot(result: GateResult, path: Path) -> bool:
    """Latency against throughput for every round of both models; False when there is nothing to plot."""
    if not result.candidate.throughput:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    series: list[tuple[str, Figures, str]] = [
        (f"candidate v{result.version}", result.candidate, "tab:orange"),
        (f"stable v{result.stable_version}", result.stable, "tab:blue"),
    ]
    for label, figures, color in series:
        if not figures.throughput:
            continue
        ax.scatter(figures.throughput, figures.p99_ms, color=color, label=f"{label} p99 per round", marker="o")
        ax.scatter(
            figures.throughput, figures.p50_ms, color=color, label=f"{label} p50 per round", marker="x", alpha=0.7
        )
        summary = figures.summary()
        ax.scatter([summary["throughput"]], [summary["p99_ms"]], color=color, marker="*", s=220, edgecolor="black",
                   label=f"{label} p99, all rounds")  # fmt: skip
    ax.set_xlabel("throughput (inferences/s)")
    ax.set_ylabel("latency (ms)")
    ax.set_title(f"{result.model} v{result.version}: {result.verdict}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def html_page(result: GateResult, png: Path | None) -> str:
    image = ""
    if png is not None and png.exists():
        encoded = base64.b64encode(png.read_bytes()).decode()
        image = f'<img alt="latency against throughput" src="data:image/png;base64,{encoded}">'
    table = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows(result))
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in result.reasons)
    tuning = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in tuning_rows(result.tuning)
    )
    if tuning:
        header = "".join(f"<th>{html.escape(h)}</th>" for h in TUNING_HEADER)
        tuning = f"<h2>Serving settings measured</h2><table><tr>{header}</tr>{tuning}</table>"
    colour = {"pass": "#1a7f37", "fail": "#cf222e"}.get(result.verdict, "#9a6700")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>gate report</title>"
        "<style>body{font-family:sans-serif;max-width:760px;margin:2em}td,th{padding:2px 10px;text-align:right}"
        "</style></head><body>"
        f"<h1>{html.escape(result.model)} v{result.version}: "
        f"<span style='color:{colour}'>{result.verdict.upper()}</span></h1>"
        f"<ul>{reasons}</ul>{image}"
        "<table><tr><th>model</th><th>round</th><th>infer/s</th><th>p50 ms</th><th>p99 ms</th></tr>"
        f"{table}</table>{tuning}</body></html>"
    )


def write(result: GateResult, out_dir: Path) -> None:
    png = out_dir / PLOT_FILE
    has_plot = plot(result, png)
    (out_dir / "report.md").write_text(markdown(result))
    (out_dir / "report.html").write_text(html_page(result, png if has_plot else None))
