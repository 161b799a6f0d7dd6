"""How good are the gate's decisions? A/A trials and injected latency regressions on the embedded stack.

    .venv/bin/python benchmarks/gate_quality.py [--injections 0:20,10:6,25:20,50:6] [--rounds 5] ...

Stable and every candidate are the same MLP served by tests/fixtures/delayed_model.py; candidates
sleep a fixed time per request, sized as +0% (A/A), +10%, +25% and +50% of the stable's measured
median latency. Each trial is one full gate decision (perf_analyzer rounds, candidate vs stable).
Reports the false-reject rate on A/A (any verdict but pass), the detection rate per regression
(verdict fail; 'blocked' counts inconclusive too), the observed p99 change, and the measurement
time per decision. Prints a table and writes benchmarks/results/gate_quality.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components import model_config, perf
from components.gate import GateSettings, Thresholds, gate
from components.publish import publish
from components.repository import ModelRepository
from components.stage import stage
from components.triton_admin import TritonAdmin
from pipelines.stack import EmbeddedStack
from tests.models import delayed_folder

MODEL = "gq"


def stable_median_us(stack: EmbeddedStack, folder: Path, load: perf.LoadSettings) -> float:
    golden = dict(__import__("numpy").load(folder / "1" / "golden.npz"))
    data = perf.write_input_data({k[3:]: v for k, v in golden.items() if k.startswith("in:")}, folder / "in.json", True)
    runs = [perf.measure(stack.gate.http_url, MODEL, data, load) for _ in range(3)]
    return statistics.median(r.points[0].p50_us for r in runs if r.ok)


def main() -> None:
    parser = argparse.ArgumentParser()
    defaults = GateSettings()
    parser.add_argument("--rounds", type=int, default=defaults.rounds)
    parser.add_argument("--window-ms", type=int, default=defaults.load.window_ms)
    parser.add_argument("--stability-pct", type=float, default=defaults.load.stability_pct)
    parser.add_argument("--max-regression-pct", type=float, default=10.0)
    parser.add_argument("--max-noise-pct", type=float, default=defaults.max_noise_pct)
    parser.add_argument("--injections", default="0:20,10:6,25:20,50:6", help="percent:trials,...")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gate_quality.json")
    args = parser.parse_args()
    load = perf.LoadSettings(concurrency=1, window_ms=args.window_ms, stability_pct=args.stability_pct)
    settings = GateSettings(
        load=load,
        thresholds=Thresholds(None, None, args.max_regression_pct, args.max_regression_pct),
        rounds=args.rounds,
        max_noise_pct=args.max_noise_pct,
    )
    results = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedStack(replicas=0, gate=True) as stack:
        tmp_path = Path(tmp)
        repo_uri = f"s3://{stack.bucket}"
        repo = ModelRepository(repo_uri, stack.s3)
        (tmp_path / "stable").mkdir()
        stable = delayed_folder(tmp_path / "stable", MODEL, delay_us=0)
        version = publish(stable, repo_uri, s3=stack.s3).version
        repo.copy_to_production(MODEL, version)
        config = model_config.pin_version(model_config.parse_pbtxt((stable / "config.pbtxt").read_text()), version)
        repo.write_desired_config(MODEL, config, None)
        TritonAdmin(stack.gate.http_url).load(MODEL, config)
        base_us = stable_median_us(stack, stable, load)
        TritonAdmin(stack.gate.http_url).unload(MODEL)
        print(f"stable median latency {base_us:.0f} us at concurrency 1; settings {settings}", flush=True)
        for pct, trials in (map(int, item.split(":")) for item in args.injections.split(",")):
            (tmp_path / f"c{pct}").mkdir()
            folder = delayed_folder(tmp_path / f"c{pct}", MODEL, delay_us=int(base_us * pct / 100))
            candidate = publish(folder, repo_uri, run_id=f"inject-{pct}", s3=stack.s3).version
            stage(repo_uri, MODEL, candidate, stack.gate.http_url, s3=stack.s3)
            verdicts, seconds, p99_changes, details = [], [], [], []
            for trial in range(trials):
                started = time.monotonic()
                result = gate(repo_uri, MODEL, candidate, stack.gate.http_url, settings, s3=stack.s3)
                verdicts.append(result.verdict)
                seconds.append(time.monotonic() - started)
                if result.p99_regression_pct is not None:
                    p99_changes.append(result.p99_regression_pct)
                details.append(
                    {
                        "verdict": result.verdict,
                        "candidate": result.candidate.to_dict(),
                        "stable": result.stable.to_dict(),
                        "p99_regression_pct": result.p99_regression_pct,
                        "throughput_regression_pct": result.throughput_regression_pct,
                        "noise_pct": result.noise_pct,
                        "measurement_seconds": result.measurement_seconds,
                        "stable_load_seconds": result.stable_load_seconds,
                    }
                )
                print(f"  +{pct}% trial {trial + 1}: {result.verdict} ({'; '.join(result.reasons)[:100]})", flush=True)
            results.append(
                {
                    "injected_pct": pct,
                    "delay_us": int(base_us * pct / 100),
                    "trials": len(verdicts),
                    "pass": verdicts.count("pass"),
                    "fail": verdicts.count("fail"),
                    "inconclusive": verdicts.count("inconclusive"),
                    "median_observed_p99_change_pct": statistics.median(p99_changes) if p99_changes else None,
                    "median_decision_seconds": statistics.median(seconds),
                    "trial_details": details,
                }
            )
    print(
        f"\n{'injected':>9} {'trials':>6} {'pass':>5} {'fail':>5} {'inconcl.':>8} {'rate':>22} {'obs. p99':>9} {'s/decision':>10}"
    )
    for r in results:
        if r["injected_pct"] == 0:
            rate = f"false-reject {(r['trials'] - r['pass']) / r['trials']:.0%}"
        else:
            rate = f"detect {r['fail'] / r['trials']:.0%} (blocked {(r['trials'] - r['pass']) / r['trials']:.0%})"
        observed = r["median_observed_p99_change_pct"]
        print(f"{'+' + str(r['injected_pct']) + '%':>9} {r['trials']:>6} {r['pass']:>5} {r['fail']:>5} {r['inconclusive']:>8} "
              f"{rate:>22} {observed if observed is None else f'{observed:+.1f}%':>9} {r['median_decision_seconds']:>10.1f}")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"base_median_us": base_us, "settings": vars(args) | {"out": str(args.out)}, "results": results}
    args.out.write_text(json.dumps(report, indent=2, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


if __name__ == "__main__":
    main()
