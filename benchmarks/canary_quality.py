"""How often promote's canary decides right on this machine, under steady live traffic, and how noisy the
comparison of two replicas is here.

    .venv/bin/python -m benchmarks.canary_quality --aa 20 --slow 10 --round-s 5 --max-bake-s 60 \
        --out benchmarks/results/canary_quality.json

On the embedded stack (two production replicas, each on a CPU of its own), v1 of a sequence model serves and
a steady client sends both replicas 40 requests/s of 96-token sequences (the live mix; the golden inputs have
8). A/A: the same model published again as a new version and promoted with the canary; a revert is a false
alarm. Slow: the same answers with extra work that grows with the length cubed (tests/models.py Sequence,
`--cubic-work`), so slower on the live mix only; a promotion is a miss; the decisions' own estimates say how
much slower. Every decision's outcome, time, effects and rounds go into the JSON; the summary gives the rates,
the median and worst time to a decision, and the A/A rounds' log-ratio SD of mean latency by round length
(consecutive rounds pooled), which says how long rounds must be on this machine."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
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


def decide(stack: EmbeddedStack, name: str, folder: Path, settings: CanarySettings) -> dict:
    version = _staged(stack, folder)
    started = time.monotonic()
    try:
        result = promote(
            repository(stack), name, version, replicas(stack), "pass", stack.gate.http_url, s3=stack.s3, canary=settings
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
        "rounds": canary.rounds,
    }


def noise_by_round_length(decisions: list[dict], round_s: float) -> dict[str, float]:
    """SD of the A/A rounds' log mean-latency ratio, with 1, 2, 4 and 8 consecutive rounds pooled into one."""
    out = {}
    for k in (1, 2, 4, 8):
        logs = []
        for d in decisions:
            rounds = [r for r in d["rounds"] if r["counted"]] if d["kind"] == "aa" else []
            for i in range(0, len(rounds) - k + 1, k):
                block = rounds[i : i + k]
                canary = sum(r["canary"]["mean_ms"] * r["canary"]["requests"] for r in block)
                baseline = sum(r["baseline"]["mean_ms"] * r["baseline"]["requests"] for r in block)
                c_n, b_n = sum(r["canary"]["requests"] for r in block), sum(r["baseline"]["requests"] for r in block)
                logs.append(np.log((canary / c_n) / (baseline / b_n)))
        if len(logs) > 2:
            out[f"{k * round_s:g} s"] = float(np.std(logs, ddof=1))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--aa", type=int, default=40)
    parser.add_argument("--slow", type=int, default=20)
    parser.add_argument("--cubic-work", type=int, default=1, help="the slow candidate's extra work (Sequence)")
    parser.add_argument("--round-s", type=float, default=5.0)
    parser.add_argument("--max-bake-s", type=float, default=60.0)
    parser.add_argument("--max-latency-regression-pct", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/canary_quality.json"))
    args = parser.parse_args()
    settings = CanarySettings(
        round_s=args.round_s,
        max_bake_s=args.max_bake_s,
        min_requests=20,
        max_latency_regression_pct=args.max_latency_regression_pct,
    )
    work = Path(tempfile.mkdtemp(prefix="canary-quality-"))
    decisions: list[dict] = []
    with EmbeddedStack(replicas=2, gate=True) as stack:
        name = "canaryq"
        install_stable(stack, sequence_folder(work, name, seed=1))
        with SteadyClient([s.http_url for s in stack.replicas], name, LIVE, ["scores"], rate_hz=40) as client:
            plan = ["aa"] * args.aa + ["slow"] * args.slow
            for i, kind in enumerate(np.random.default_rng(0).permutation(plan)):
                folder = sequence_folder(work, name, seed=1, cubic_work=args.cubic_work if kind == "slow" else 0)
                decisions.append({"kind": str(kind), **decide(stack, name, folder, settings)})
                print(i + 1, kind, decisions[-1]["decision"], f"{decisions[-1]['seconds']:.1f} s", flush=True)
                args.out.parent.mkdir(parents=True, exist_ok=True)  # kept after every decision: a cut run keeps them
                args.out.write_text(json.dumps({"decisions": decisions}, indent=2, default=str))
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
        "slow_latency_effect_median_pct": float(
            np.median([_latency(d) for d in decisions if d["kind"] == "slow" and _latency(d) is not None] or [np.nan])
            * 100
        ),
        "aa_log_ratio_sd_by_round_length": noise_by_round_length(decisions, args.round_s),
        "command": " ".join(sys.argv),
        "settings": settings.__dict__,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"summary": summary, "decisions": decisions}, indent=2, default=str))
    print(json.dumps(summary, indent=2, default=str))


def _latency(decision: dict) -> float | None:
    return next((e["estimate"] for e in decision["effects"] if e["name"] == "mean latency"), None)


if __name__ == "__main__":
    main()
