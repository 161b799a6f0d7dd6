"""The gate report: Markdown and HTML (with each limit's interval plotted against the limit) of a gate result."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from components.release.effect_plot import PLOT_FILE, embedded_image, plot
from components.release.quality import report as quality_report
from components.release.results import GateResult
from components.serving import server_metrics


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def rows(result: GateResult) -> list[tuple[str, str, str, str, str, str]]:
    """(model, rounds, requests, infer/s, p50, p99) for both models, over every round pooled."""
    out = []
    for label, rounds in (("candidate", result.candidate), ("stable", result.stable)):
        if len(rounds):
            t = rounds.summary()
            out.append(
                (
                    label,
                    str(t["rounds"]),
                    f"{t['requests']:,}",
                    _fmt(t["throughput"], ",.0f"),
                    _fmt(t["p50_ms"], ".3f"),
                    _fmt(t["p99_ms"], ".3f"),
                )
            )
    return out


SUMMARY_HEADER = ("model", "rounds", "requests", "infer/s", "p50 ms", "p99 ms")


TUNING_HEADER = (
    "instances",
    "threads",
    "max batch",
    "queue delay µs",
    "preferred",
    "infer/s",
    "p99 ms",
    "GPU %",
    "CPU %",
    "",
)


def tuning_rows(tuning: dict[str, Any] | None) -> list[tuple[str, ...]]:
    """One row per setting the tune step measured (TuneResult's JSON), the chosen one marked."""
    if not tuning:
        return []
    chosen, warm_up = tuning["chosen"], tuning.get("warm_up")
    out = []
    for trial in ([warm_up] if warm_up else []) + tuning["trials"]:
        settings = trial["settings"]
        note = "chosen" if settings == chosen else trial["problem"]
        if trial is warm_up:
            note = f"warm-up, not counted{', ' + trial['problem'] if trial['problem'] else ''}"
        if settings == tuning["default"]:
            note = f"default{', ' + note if note else ''}"
        out.append(
            (
                _instances(settings),
                _threads(settings),
                str(settings["max_batch_size"] or "-"),
                str(settings["max_queue_delay_us"]) if settings["dynamic_batching"] else "off",
                ",".join(map(str, settings["preferred_batch_sizes"])) or "-",
                _fmt(trial["throughput"], ",.0f"),
                _fmt(trial["p99_ms"], ".3f"),
                _fmt(trial.get("server", {}).get("gpu_util_pct_mean"), ".0f"),
                _fmt(trial.get("server", {}).get("cpu_util_pct_mean"), ".0f"),
                note,
            )
        )
    return out


def _threads(settings: dict[str, Any]) -> str:
    """The intra-op threads, and "unoptimized" where the TorchScript profiling executor is off."""
    off = "" if settings.get("optimized_execution", True) else ", unoptimized"
    return str(settings.get("intra_op_threads", "-")) + off


def _instances(settings: dict[str, Any]) -> str:
    steps = settings.get("step_instance_count")
    return str(settings["instance_count"]) + ("" if steps is None else f" (steps {steps})")


def tuning_markdown(t: dict[str, Any] | None) -> list[str]:
    if not t:
        return []
    gain = "-" if t["gain_pct"] is None else f"{t['gain_pct']:+.1f}%"
    rate, limit = t.get("request_rate"), _fmt(t["p99_limit_ms"], ".3f")
    objective = (
        f"p99 {gain} lower than the default's at {rate:,.0f} requests/s (limit {limit} ms)"
        if rate
        else f"throughput {gain} over the default within p99 {limit} ms"
    )
    return [
        "",
        f"## Serving settings: {t['settings_measured']} of {t['grid_size']} measured, {objective}",
        *(["", f"The search's winner, {t['confirmation']}."] if t.get("confirmation") else []),
        *(
            ["", "Measured with requests of " + ", ".join(f"{k} {v}" for k, v in t["request_shapes"].items()) + "."]
            if t.get("request_shapes")
            else []
        ),
        "",
        f"| {' | '.join(TUNING_HEADER)} |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        *[f"| {' | '.join(row)} |" for row in tuning_rows(t)],
    ]


def how_measured(result: GateResult) -> str:
    settings = result.settings
    load = (
        f"request rate {settings['request_rate']}/s"
        if settings.get("request_rate")
        else f"concurrency {settings.get('concurrency')}"
    )
    attempts = len({(a.round, a.attempt) for a in result.attempts})
    groups = settings.get("client_cpu_groups")
    where = (
        f" (both perf_analyzers on the same CPUs, in turn {' | '.join(','.join(map(str, g)) for g in groups)})"
        if groups
        else ""
    )
    shapes = settings.get("request_shapes")
    shaped = f", requests of {', '.join(f'{k} {v}' for k, v in shapes.items())}" if shapes else ""
    return (
        f"{settings.get('design', '?')} design{where}, {load}{shaped}, windows of {settings.get('window_ms')} ms; "
        f"{result.rounds} rounds ({attempts} perf_analyzer attempts), {result.measurement_seconds:.1f} s of "
        f"measurement, intervals at {settings.get('confidence', 0.9):.0%}; {result.stopped or 'not measured'}."
    )


def findings(result: GateResult) -> list[str]:
    """The report's list, each thing said once: the verdict's reasons (a decided verdict's are its limits' own
    figures), then each limit's figure that no reason gives already."""
    figures = [e.describe() for e in result.effects]
    return result.reasons + [f for f in figures if not any(f in reason for reason in result.reasons)]


def markdown(result: GateResult) -> str:
    stable = f"v{result.stable_version}" if result.stable_version is not None else "none (first release)"
    lines = [
        f"# Gate: {result.model} v{result.version} — **{result.verdict.upper()}**",
        "",
        f"Stable: {stable}. {how_measured(result)}",
        "",
        f"Gate server while measuring: {server_metrics.describe(result.server)}.",
        "",
        *[f"- {finding}" for finding in findings(result)],
        "",
        f"| {' | '.join(SUMMARY_HEADER)} |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *[f"| {' | '.join(row)} |" for row in rows(result)],
        *tuning_markdown(result.tuning),
    ]
    if result.quality is not None:
        lines += ["", *quality_report.markdown_lines(result.quality, said=result.reasons)]
    return "\n".join(lines) + "\n"


def html_page(result: GateResult, png: Path | None, quality_png: Path | None = None) -> str:
    image = embedded_image(png)
    table = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows(result))
    header = "".join(f"<th>{html.escape(h)}</th>" for h in SUMMARY_HEADER)
    said = "".join(f"<li>{html.escape(finding)}</li>" for finding in findings(result))
    tuning = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in tuning_rows(result.tuning)
    )
    if tuning:
        tuning_header = "".join(f"<th>{html.escape(h)}</th>" for h in TUNING_HEADER)
        tuning = f"<h2>Serving settings measured</h2><table><tr>{tuning_header}</tr>{tuning}</table>"
    colour = {"pass": "#1a7f37", "fail": "#cf222e"}.get(result.verdict, "#9a6700")
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>gate report</title>"
        "<style>body{font-family:sans-serif;max-width:760px;margin:2em}td,th{padding:2px 10px;text-align:right}"
        "</style></head><body>"
        f"<h1>{html.escape(result.model)} v{result.version}: "
        f"<span style='color:{colour}'>{result.verdict.upper()}</span></h1>"
        f"<p>{html.escape(how_measured(result))}</p>"
        f"<p>Gate server while measuring: {html.escape(server_metrics.describe(result.server))}.</p>"
        f"<ul>{said}</ul>{image}"
        f"<table><tr>{header}</tr>{table}</table>{tuning}"
        + (
            quality_report.html_section(result.quality, embedded_image(quality_png), said=result.reasons)
            if result.quality
            else ""
        )
        + "</body></html>"
    )


def write(result: GateResult, out_dir: Path) -> None:
    png = out_dir / PLOT_FILE
    has_plot = plot(result.effects, f"{result.model} v{result.version}: {result.verdict} ({result.rounds} rounds)", png)
    quality_png = out_dir / quality_report.PLOT_FILE
    has_quality_plot = result.quality is not None and plot(
        quality_report.effects(result.quality), f"{result.model} v{result.version}: quality", quality_png
    )
    (out_dir / "report.md").write_text(markdown(result))
    (out_dir / "report.html").write_text(
        html_page(result, png if has_plot else None, quality_png if has_quality_plot else None)
    )
