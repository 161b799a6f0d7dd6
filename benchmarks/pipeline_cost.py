"""What a release costs: the time of each step of the demo's release (run as the pipeline runs them),
split into unavoidable work (Triton loading a model, perf_analyzer's measurement windows) and the
rest (our own overhead: export, compile, S3 transfers, checks, the local runner).

    .venv/bin/python benchmarks/pipeline_cost.py [--repeats 3]

Releases v1 (first release) then v2 (gated against v1, promoted to 2 replicas) of the sample model,
`repeats` times in one invocation, on the embedded stack; medians per step. Then one whole local KFP
run of the same release, to show what the local runner adds. Writes benchmarks/results/pipeline_cost.json.
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

from components.model.compile import compile_model
from components.model.export import export
from components.release.gate.gate import gate
from components.release.promote.promote import promote
from components.release.promote.settings import PromoteSettings
from components.release.publish import publish
from components.release.run_context import RunContext
from components.release.stage import stage
from components.serving.replicas import Replica
from components.settings import GateSettings, Thresholds
from pipelines.demo import demo_parameters
from pipelines.local import run_local
from pipelines.sample_models import SAMPLE_SIGNATURE
from pipelines.stack import EmbeddedStack

# The demo's gate: the defaults with an absolute p99 limit, so that both measurements match.
SETTINGS = GateSettings(thresholds=Thresholds(max_p99_ms=50))


def release(stack: EmbeddedStack, tmp: Path, model: str, source: str) -> dict[str, dict[str, float]]:
    """One release, step by step: {step: {"total": s, "unavoidable": s}}."""
    repo = f"s3://{stack.bucket}"
    cost: dict[str, dict[str, float]] = {}

    def timed(step: str, fn, unavoidable=lambda result: 0.0):
        started = time.monotonic()
        result = fn()
        cost[step] = {"total": time.monotonic() - started, "unavoidable": unavoidable(result)}
        return result

    (tmp / "sig.yaml").write_text(SAMPLE_SIGNATURE)
    timed("export", lambda: export(source, tmp / "sig.yaml", tmp / "export"))
    timed("compile", lambda: compile_model(tmp / "export", tmp / "folder", model))
    version = timed("publish", lambda: publish(RunContext(repo, "", s3=stack.s3), folder=tmp / "folder")).version
    staged = timed(
        "stage", lambda: stage(RunContext(repo, model, version, stack.gate.replica, stack.s3)), lambda r: r.load_seconds
    )
    on_gate = RunContext(repo, model, version, Replica("gate", stack.gate.http_url), stack.s3)
    verdict = timed(
        "gate",
        lambda: gate(on_gate, SETTINGS, staged),
        lambda r: r.measurement_seconds + r.stable_load_seconds,
    )
    replicas = [s.replica for s in stack.replicas]
    context = RunContext(repo, model, version, stack.gate.replica, stack.s3)
    no_canary = PromoteSettings.from_flat(canary=False)  # the rollout's cost alone
    timed(
        "promote",
        lambda: promote(context, no_canary, replicas=replicas, verdict=verdict.verdict),
        lambda r: sum(r.load_seconds),
    )
    return cost


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    runs: list[dict[str, dict[str, float]]] = []
    with EmbeddedStack(replicas=2, gate=True) as stack:
        for i in range(args.repeats):
            for source in ("pipelines.sample_models:sample_v1", "pipelines.sample_models:sample_v2"):
                with tempfile.TemporaryDirectory() as tmp:
                    cost = release(stack, Path(tmp), f"cost{i}", source)
                if source.endswith("v2"):  # the gated release: both models measured, two replicas
                    runs.append(cost)
        with tempfile.TemporaryDirectory() as tmp:
            params = demo_parameters(stack, "pipelines.sample_models:sample_v1") | {"model_name": "costkfp"}
            run_local(params, Path(tmp), env=stack.s3.env())  # v1
            started = time.monotonic()
            run_local(params | {"model_source": "pipelines.sample_models:sample_v2"}, Path(tmp), env=stack.s3.env())
            local_run_seconds = time.monotonic() - started
    steps = list(runs[0])
    median = {s: {k: statistics.median(r[s][k] for r in runs) for k in ("total", "unavoidable")} for s in steps}
    total = sum(m["total"] for m in median.values())
    unavoidable = sum(m["unavoidable"] for m in median.values())
    print(f"{'step':<9} {'total s':>8} {'unavoidable s':>14} {'ours s':>7}")
    for step, m in median.items():
        print(f"{step:<9} {m['total']:>8.2f} {m['unavoidable']:>14.2f} {m['total'] - m['unavoidable']:>7.2f}")
    print(
        f"{'all':<9} {total:>8.2f} {unavoidable:>14.2f} {total - unavoidable:>7.2f}   "
        f"our overhead {100 * (total - unavoidable) / total:.0f}% of the steps' time"
    )
    print(
        f"the same release as one KFP local run: {local_run_seconds:.1f} s "
        f"(+{local_run_seconds - total:.1f} s for the local runner's task subprocesses)"
    )
    out = Path(__file__).parent / "results" / "pipeline_cost.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {"repeats": args.repeats, "median_per_step": median, "runs": runs, "local_run_seconds": local_run_seconds},
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
