"""Serving-config tuning on the embedded stack: the tuned settings against the default at the same p99
limit, and how much of the full grid the coordinate search measured to get within 5% of its best.

    .venv/bin/python benchmarks/tuning.py [--concurrency 4] [--window-ms 500]

For the recommender (two int64 inputs, top-k outputs) and the small CNN: export, compile (TorchScript,
Triton's PyTorch backend), publish, stage on the gate, run the tune step (coordinate search), then measure every
setting of the full grid once on the same gate. Each setting is measured by the tune step's own code
(GateBench: reload with a config override, warm up, perf_analyzer). Writes
benchmarks/results/tuning.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.model.compile import compile_model
from components.model.export import export
from components.release.publish import publish
from components.release.run_context import RunContext
from components.release.stage import read_candidate, stage
from components.release.tune.tune import GateBench, TuneSettings, default_settings, grid, tune
from components.repository import ModelRepository
from components.serving import perf
from components.serving.replicas import Replica
from pipelines.stack import EmbeddedStack
from tests.models import CNN_SIGNATURE, RECOMMENDER_SIGNATURE, write_signature

MODELS = {
    "recommender": ("tests.models:make_recommender", RECOMMENDER_SIGNATURE),
    "cnn": ("tests.models:make_cnn", CNN_SIGNATURE),
}
RESULTS = Path(__file__).parent / "results" / "tuning.json"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--window-ms", type=int, default=500)
    parser.add_argument("--models", nargs="*", default=list(MODELS))
    args = parser.parse_args()
    load = perf.LoadSettings(concurrency=args.concurrency, window_ms=args.window_ms, stability_pct=20)
    settings = TuneSettings(load=load, instance_counts=(1, 2))  # 2 cores here: a third instance only queues
    rows = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedStack(replicas=0, gate=True) as stack:
        tmp_path = Path(tmp)
        repository = f"s3://{stack.bucket}"
        for name in args.models:
            factory, signature = MODELS[name]
            write_signature(tmp_path / f"{name}.yaml", signature)
            export(factory, tmp_path / f"{name}.yaml", tmp_path / f"{name}-export")
            compile_model(tmp_path / f"{name}-export", tmp_path / name, name)
            version = publish(RunContext(repository, "", s3=stack.s3), folder=tmp_path / name).version
            stage(RunContext(repository, name, version, stack.gate.replica, stack.s3))

            started = time.monotonic()
            on_gate = RunContext(repository, name, version, Replica("gate", stack.gate.http_url), stack.s3)
            searched = tune(on_gate, settings)
            search_seconds = time.monotonic() - started

            candidate = read_candidate(ModelRepository(repository, stack.s3), name, version)
            bench = GateBench(stack.gate.http_url, candidate, load, settings.perf_timeout_s)
            full = []
            started = time.monotonic()
            for point in grid(default_settings(candidate.config), settings):
                full.append(bench.measure(point))
                print(name, full[-1].row(), flush=True)
            grid_seconds = time.monotonic() - started
            bench.close()
            rows.append(summarise(name, searched, full, search_seconds, grid_seconds))
            print(json.dumps(rows[-1], indent=2), flush=True)
    RESULTS.write_text(json.dumps({"load": asdict(load), "settings": asdict(settings), "models": rows}, indent=2))
    print_table(rows)


def summarise(name, searched, full, search_seconds, grid_seconds) -> dict:
    """Figures from the grid's own measurements, so the search and the grid are compared on one scale."""
    limit = searched.p99_limit_ms
    by_settings = {t.settings: t for t in full}
    within = [t for t in full if t.measured and t.p99_ms <= limit]
    best = max(within, key=lambda t: t.throughput)
    default = by_settings[searched.default]
    chosen = by_settings[searched.chosen]
    # how many settings the search had measured when one of them was within 5% of the grid's best
    needed = next(
        (
            i + 1
            for i, trial in enumerate(searched.trials)
            if (g := by_settings.get(trial.settings))
            and g.measured
            and g.p99_ms <= limit
            and g.throughput >= 0.95 * best.throughput
        ),
        None,
    )
    return {
        "model": name,
        "p99_limit_ms": limit,
        "grid_size": len(full),
        "search_measured": len(searched.trials),
        "search_measured_share": len(searched.trials) / len(full),
        "measured_to_within_5pct": needed,
        "share_to_within_5pct": needed / len(full) if needed else None,
        "default": {"settings": asdict(searched.default), "throughput": default.throughput, "p99_ms": default.p99_ms},
        "chosen": {"settings": asdict(searched.chosen), "throughput": chosen.throughput, "p99_ms": chosen.p99_ms},
        "grid_best": {"settings": asdict(best.settings), "throughput": best.throughput, "p99_ms": best.p99_ms},
        "tuned_over_default": chosen.throughput / default.throughput,
        "chosen_over_grid_best": chosen.throughput / best.throughput,
        "search_reported_gain_pct": searched.gain_pct,
        "search_seconds": search_seconds,
        "grid_seconds": grid_seconds,
        "grid": [t.row() for t in full],
        "search": [t.row() for t in searched.trials],
    }


def print_table(rows: list[dict]) -> None:
    print(
        f"\n{'model':12} {'default/s':>10} {'tuned/s':>9} {'x':>6} {'grid best/s':>12} {'chosen/best':>12} "
        f"{'measured':>9} {'to 5%':>7} {'search s':>9} {'grid s':>7}"
    )
    for r in rows:
        print(
            f"{r['model']:12} {r['default']['throughput']:>10,.0f} {r['chosen']['throughput']:>9,.0f} "
            f"{r['tuned_over_default']:>6.2f} {r['grid_best']['throughput']:>12,.0f} {r['chosen_over_grid_best']:>12.2f} "
            f"{r['search_measured']:>4}/{r['grid_size']:<4} {r['measured_to_within_5pct'] or '-':>7} "
            f"{r['search_seconds']:>9.0f} {r['grid_seconds']:>7.0f}"
        )


if __name__ == "__main__":
    main()
