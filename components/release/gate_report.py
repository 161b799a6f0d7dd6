"""The gate report: Markdown and HTML (with each limit's interval plotted against the limit) of a gate result."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from components.release.gate_stats import Effect
from components.release.results import GateResult
from components.serving import server_metrics

PLOT_FILE = "limits.png"


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
    attempts = len({(a["round"], a["attempt"]) for a in result.attempts})
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
        f"measurement; {result.stopped or 'not measured'}."
    )


def markdown(result: GateResult) -> str:
    stable = f"v{result.stable_version}" if result.stable_version is not None else "none (first release)"
    lines = [
        f"# Gate: {result.model} v{result.version} — **{result.verdict.upper()}**",
        "",
        f"Stable: {stable}. {how_measured(result)}",
        "",
        f"Gate server while measuring: {server_metrics.describe(result.server)}.",
        "",
        *[f"- {reason}" for reason in result.reasons],
    ]
    if result.effects:
        lines += [
            "",
            f"| limit | estimate [{result.settings.get('confidence', 0.9):.0%} interval] | status |",
            "| --- | --- | --- |",
        ]
        lines += [f"| {e.name} | {e.describe().rsplit(': ', 1)[0]} | {e.status} |" for e in result.effects]
    lines += [
        "",
        f"| {' | '.join(SUMMARY_HEADER)} |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
        *[f"| {' | '.join(row)} |" for row in rows(result)],
        *tuning_markdown(result.tuning),
    ]
    return "\n".join(lines) + "\n"


def plot(effects: list[Effect], title: str, path: Path) -> bool:
    """Each limit's interval against the limit (the gate's and the canary's); False when there is nothing to plot."""
    if not effects:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(effects), 1, figsize=(6.4, 1.3 + 1.1 * len(effects)), dpi=110, squeeze=False)
    for ax, effect in zip(axes[:, 0], effects, strict=True):
        scale = 100 if effect.unit == "%" else 1
        est, low, high, limit = (v * scale for v in (effect.estimate, effect.low, effect.high, effect.limit))
        colour = {"within": "tab:green", "beyond": "tab:red"}.get(effect.status, "tab:orange")
        ax.errorbar([est], [0], xerr=[[est - low], [high - est]], fmt="o", color=colour, capsize=6, lw=2)
        ax.axvline(limit, color="black", ls="--", lw=1)
        span = max(abs(high - low), abs(limit - est), 1e-9)
        left, right = min(low, limit) - 0.3 * span, max(high, limit) + 0.3 * span
        bad = (limit, right) if effect.higher_is_worse else (left, limit)
        ax.axvspan(*bad, color="tab:red", alpha=0.08)
        ax.set_xlim(left, right)
        ax.set_yticks([])
        unit = "%" if effect.unit == "%" else f" {effect.unit}"
        ax.set_title(
            f"{effect.name}: {est:+.1f}{unit} [{low:+.1f}, {high:+.1f}], limit {limit:+g}{unit} — {effect.status}"
            if effect.unit == "%"
            else f"{effect.name}: {est:,.2f}{unit} [{low:,.2f}, {high:,.2f}], limit {limit:g}{unit} — {effect.status}",
            fontsize=9,
        )
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def embedded_image(png: Path | None) -> str:
    """An <img> of the plot inside the page itself (the KFP UI shows one HTML file), or nothing."""
    if png is None or not png.exists():
        return ""
    encoded = base64.b64encode(png.read_bytes()).decode()
    return f'<img alt="the interval of each limit against the limit" src="data:image/png;base64,{encoded}">'


def html_page(result: GateResult, png: Path | None) -> str:
    image = embedded_image(png)
    table = "".join("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in row) + "</tr>" for row in rows(result))
    header = "".join(f"<th>{html.escape(h)}</th>" for h in SUMMARY_HEADER)
    effects = "".join(f"<li>{html.escape(e.describe())}</li>" for e in result.effects)
    reasons = "".join(f"<li>{html.escape(r)}</li>" for r in result.reasons)
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
        f"<ul>{reasons}</ul>{image}<ul>{effects}</ul>"
        f"<table><tr>{header}</tr>{table}</table>{tuning}</body></html>"
    )


def write(result: GateResult, out_dir: Path) -> None:
    png = out_dir / PLOT_FILE
    has_plot = plot(result.effects, f"{result.model} v{result.version}: {result.verdict} ({result.rounds} rounds)", png)
    (out_dir / "report.md").write_text(markdown(result))
    (out_dir / "report.html").write_text(html_page(result, png if has_plot else None))
