"""How often promote's canary decides right on this machine, under steady live traffic.

    .venv/bin/python -m benchmarks.canary_quality --aa 40 --slow 20 --out benchmarks/results/canary_quality.json

On the embedded stack (two production replicas), v1 of a sequence model serves and a steady client sends
both replicas long sequences (the live mix). A/A: the same model published again as a new version and
promoted with the canary; a revert is a false alarm. Slow: a candidate whose busy work makes the live mix's
p99 about 25% higher (tests/latency_injection.py, sized from this process's calibration); a promotion is a
miss. Every decision's outcome, time and effects go into the JSON; the summary prints the rates and the median
and worst time to a decision."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from components.canary_settings import CanarySettings
from components.promote import CanaryRejected, promote
from pipelines.stack import EmbeddedStack
from tests.models import sequence_folder
from tests.release_helpers import SteadyClient, install_stable, replicas, repository
from tests.test_canary import LIVE, _staged

SETTINGS = CanarySettings(round_s=2.0, max_bake_s=60.0, min_requests=20)


def decide(stack: EmbeddedStack, name: str, folder: Path) -> dict:
    version = _staged(stack, folder)
    started = time.monotonic()
    try:
        result = promote(
            repository(stack), name, version, replicas(stack), "pass", stack.gate.http_url, s3=stack.s3, canary=SETTINGS
        )
    except CanaryRejected as exc:
        result = exc.result
    canary = result.canary
    return {
        "version": version,
        "decision": canary.decision,
        "outcome": canary.outcome,
        "seconds": time.monotonic() - started,
        "bake_seconds": canary.seconds,
        "effects": canary.effects,
        "reasons": canary.reasons,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--aa", type=int, default=40)
    parser.add_argument("--slow", type=int, default=20)
    parser.add_argument("--cubic-work", type=int, default=2, help="the slow candidate's extra work (Sequence)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/canary_quality.json"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="canary-quality-"))
    decisions: list[dict] = []
    with EmbeddedStack(replicas=2, gate=True) as stack:
        name = "canaryq"
        install_stable(stack, sequence_folder(work, name, seed=1))
        with SteadyClient([s.http_url for s in stack.replicas], name, LIVE, ["scores"], rate_hz=40) as client:
            plan = ["aa"] * args.aa + ["slow"] * args.slow
            for i, kind in enumerate(np.random.default_rng(0).permutation(plan)):
                folder = sequence_folder(work, name, seed=1, cubic_work=args.cubic_work if kind == "slow" else 0)
                decisions.append({"kind": str(kind), **decide(stack, name, folder)})
                print(i + 1, kind, decisions[-1]["decision"], f"{decisions[-1]['seconds']:.1f} s", flush=True)
    seconds = [d["seconds"] for d in decisions]
    summary = {
        "aa_reverted": sum(d["kind"] == "aa" and d["outcome"] == "reverted" for d in decisions),
        "aa": args.aa,
        "slow_caught": sum(d["kind"] == "slow" and d["outcome"] == "reverted" for d in decisions),
        "slow": args.slow,
        "median_s": statistics.median(seconds),
        "worst_s": max(seconds),
        "client_requests": client.total,
        "client_failures": len(client.failures),
        "settings": SETTINGS.__dict__,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "decisions": decisions}, indent=2, default=str))
    print(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
