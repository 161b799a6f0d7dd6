"""A fleet through one gate server: four models released at once, two equal retrains and two 25% slower, each
verdict against the one the model gets when released alone, with live traffic on both production replicas.

    .venv/bin/python benchmarks/fleet.py --out benchmarks/results/fleet.json

Every model is the demo's trained BERT4Rec (benchmarks/gate_quality.py `demo_model`) under its own name, served by
Triton's PyTorch backend on the embedded stack (two production replicas, one gate server). A slower candidate carries
busy work sized at +25% of the stable's median latency at the gate's load (gate_quality.py `--size-by median`). A release is the steps
that measure and decide, as the pipeline calls them: publish, stage, gate (the product's default limits and budget,
which take the gate lease, components/release/gate_turn.py), then promote (no canary) or reject.

First each model is released alone, one after another: the verdict it gets alone and the time four releases take in
a row. Then new versions of the same four candidates are released at once, each in its own thread: each verdict,
its wait for the gate server and the total time. A client sends each model 25 requests/s on each production replica
throughout; every failed request is counted.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gate_quality import demo_model, model_folder, served_iteration_us, stable_latency_us
from components.release.gate.gate import gate
from components.release.promote.promote import promote, reject
from components.release.publish import publish
from components.release.run_context import RunContext
from components.release.stage import stage
from components.repository import ModelRepository
from components.serving.triton_admin import TritonAdmin
from components.settings import GateSettings
from pipelines.live_traffic import LiveTraffic
from pipelines.stack import EmbeddedStack
from tests.release_helpers import NO_CANARY, install_stable, replicas, repository

SLOWER = {"fleet_a": 0, "fleet_b": 0, "fleet_c": 25, "fleet_d": 25}  # percent of the stable's median added
LIVE_RATE_HZ = 25.0  # per model and replica: four models, two replicas, 200 requests/s in all


def release(stack: EmbeddedStack, folder: Path, run_id: str) -> dict:
    """publish -> stage -> gate -> promote or reject, as the pipeline runs them; the outcome and its times."""
    started = time.monotonic()
    published = publish(RunContext(repository(stack), "", s3=stack.s3, run_id=run_id), folder=folder)
    model, version = published.model, published.version
    context = RunContext(repository(stack), model, version, stack.gate.replica, stack.s3, run_id)
    staged = stage(context)
    verdict = gate(context, GateSettings(), staged)
    if verdict.verdict == "pass":
        promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass")
    else:
        reject(context, verdict.verdict, verdict.reasons)
    return {
        "model": model,
        "version": version,
        "verdict": verdict.verdict,
        "reasons": verdict.reasons,
        "rounds": verdict.rounds,
        "gate_wait_s": verdict.gate_wait_s,
        "measurement_seconds": verdict.measurement_seconds,
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fleet.json"))
    args = parser.parse_args()
    report: dict = {"command": " ".join(["python benchmarks/fleet.py", *sys.argv[1:]]), "slower_pct": SLOWER}
    save = lambda: args.out.write_text(json.dumps(report, indent=1, default=str))  # noqa: E731
    with TemporaryDirectory(prefix="tritonship-fleet-") as tmp, EmbeddedStack(replicas=2, gate=True) as stack:
        work = Path(tmp)
        base = demo_model(work)
        stables = {name: model_folder(work, f"stable_{name}", 0, base, name=name) for name in SLOWER}
        for folder in stables.values():
            install_stable(stack, folder)
        config, _ = ModelRepository(repository(stack), stack.s3).desired_config("fleet_a")
        with TritonAdmin(stack.gate.http_url) as admin:  # sized at the gate's load, as gate_quality.py sizes it
            admin.load("fleet_a", config)
            median_us = stable_latency_us(stack, stables["fleet_a"], "fleet_a")["median"]
            per_iteration_us = served_iteration_us(stack, work, base, "fleet_a")
            admin.unload("fleet_a")
        report |= {"stable_median_us": median_us, "busy_iteration_us": per_iteration_us}
        candidates = {
            name: model_folder(work, f"candidate_{name}", median_us * pct / 100, base, per_iteration_us, name=name)
            for name, pct in SLOWER.items()
        }
        golden = dict(np.load(base / "1" / "golden.npz"))
        request = {k[3:]: v[:1] for k, v in golden.items() if k.startswith("in:")}
        outputs = [k[4:] for k in golden if k.startswith("out:")]
        urls = [s.http_url for s in stack.replicas]
        clients = [LiveTraffic(urls, name, request, outputs, rate_hz=LIVE_RATE_HZ) for name in SLOWER]
        for client in clients:
            client.__enter__()
        try:
            started = time.monotonic()
            report["alone"] = [release(stack, candidates[name], f"alone-{name}") for name in SLOWER]
            report["alone_seconds"] = round(time.monotonic() - started, 1)
            save()
            print(f"alone, one after another: {report['alone_seconds']} s", flush=True)
            for outcome in report["alone"]:
                print(f"  {outcome}", flush=True)
            together: dict[str, dict] = {}

            def released(name: str) -> None:
                together[name] = release(stack, candidates[name], f"fleet-{name}")

            threads = [threading.Thread(target=released, args=(name,)) for name in SLOWER]
            started = time.monotonic()
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            report["together_seconds"] = round(time.monotonic() - started, 1)
            report["together"] = [together[name] for name in SLOWER if name in together]
        finally:
            for client in clients:
                client.__exit__(None, None, None)
        report["live_requests"] = sum(c.total for c in clients)
        report["live_failures"] = sum(len(c.failures) for c in clients)
    alone = {o["model"]: o["verdict"] for o in report["alone"]}
    report["summary"] = {
        "verdicts_alone": alone,
        "verdicts_together": {o["model"]: o["verdict"] for o in report["together"]},
        "same_verdicts": all(alone[o["model"]] == o["verdict"] for o in report["together"])
        and len(report["together"]) == len(SLOWER),
        "gate_wait_s": {o["model"]: o["gate_wait_s"] for o in report["together"]},
        "alone_seconds": report["alone_seconds"],
        "together_seconds": report["together_seconds"],
        "live_requests": report["live_requests"],
        "live_failures": report["live_failures"],
    }
    save()
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
