"""How often promote's canary decides right on this machine, for the users' model under steady live traffic.

    .venv/bin/python -m benchmarks.canary_quality --aa 40 --slow 20 --slow-window 6 \
        --out benchmarks/results/canary_quality.json
    .venv/bin/python -m benchmarks.canary_quality --aa 0 --slow 20 --slow-window 7 \
        --out benchmarks/results/canary_quality_window_7.json
    .venv/bin/python -m benchmarks.canary_quality --effect-only --slow-window 7  # its own effect, apart

On the embedded stack (two production replicas, each on a CPU of its own) the demo's BERT4Rec (`demo_v2`,
TorchScript through Triton's PyTorch backend) serves, and steady clients send each replica `--rate` requests a
second of the live mix (histories of 32 to 40 items; the gate measures at 8, pipelines/live_traffic.py), each
client on its replica's CPU.
A/A: the same model published again as a new version and promoted with the canary; a revert is a false alarm.
Slow: the same answers with extra work that grows with the history's length cubed (`slow_window_6`, `_7`), so
slower on the live mix only; a promotion is a miss. Each decision's outcome, time, effects and rounds go into
the JSON after it is made (a cut run keeps them, and `--resume` goes on from them on a fresh stack); the
summary gives the rates, the median and worst time to a decision, how much slower the slow candidate was
(the decisions' own mean-latency estimates, and the p99 from Triton's summaries in the last round before and
after the switch, which at rounds under a minute says little) and the A/A rounds' noise."""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from components.release.promote.promote import promote
from components.release.promote.settings import CanarySettings, PromoteSettings
from components.release.publish import publish
from components.release.run_context import RunContext
from components.release.stage import stage
from components.repository import ModelRepository
from components.serving import perf
from components.settings import RELAXED_STABILITY_PCT, LoadSettings
from pipelines.live_traffic import LIVE_OUTPUTS, LiveTraffic, live_request
from pipelines.samples import bert4rec
from pipelines.samples.bert4rec import build as bert4rec_build
from pipelines.stack import EmbeddedStack
from tests.release_helpers import install_stable, replicas, repository

MODEL = "bert4rec"


def slow_window_6() -> bert4rec.LongHistoryCost:
    """demo_v2's answers with a 6 times wider window of extra work: nothing at 8 positions, on the live mix about
    +33% mean latency and +20% p99 (`--effect-only --slow-window 6`, benchmarks/README.md)."""
    return bert4rec.LongHistoryCost(bert4rec.bert4rec_v2(), window=6)


def slow_window_7() -> bert4rec.LongHistoryCost:
    """The same with a 7 times wider window: on the live mix about +60% mean latency and +31% p99."""
    return bert4rec.LongHistoryCost(bert4rec.bert4rec_v2(), window=7)


def slow_factory(window: int) -> str:
    return f"benchmarks.canary_quality:slow_window_{window}"


def decide(stack: EmbeddedStack, folder: Path, run_id: str, settings: CanarySettings) -> dict:
    published = publish(RunContext(repository(stack), "", s3=stack.s3, run_id=run_id), folder=folder)
    staged = stage(RunContext(repository(stack), MODEL, published.version, stack.gate.replica, stack.s3))
    assert staged.accuracy_passed, staged.load_error
    started = time.monotonic()
    context = RunContext(repository(stack), MODEL, published.version, stack.gate.replica, stack.s3)
    chosen = PromoteSettings(canary=settings)
    result = promote(context, chosen, replicas=replicas(stack), verdict="pass")  # promoted, or reverted by the canary
    canary = result.canary
    return {
        "version": published.version,
        "decision": canary.decision,
        "outcome": canary.outcome,
        "seconds": time.monotonic() - started,
        "effects": canary.effects,
        "reasons": canary.reasons,
        "calibration": [r.to_dict() for r in canary.calibration],
        "rounds": [r.to_dict() for r in canary.rounds],
    }


def live_mix_effect(stack: EmbeddedStack, work: Path, slow: str, rounds: int = 24) -> dict:
    """The slow candidate's own effect on the live mix, measured apart from the canary: demo_v2 and
    the `slow` factory's candidate served side by side on one production replica as two models, perf_analyzer at concurrency 1
    with 64 of the clients' histories, the two models taking turns for `rounds` rounds (every request's latency
    from the profile export); the median over rounds of each round's p99 and mean ratio, slow over stable."""
    names = {"stable": "effect_stable", "slow": "effect_slow"}
    for kind, factory in (("stable", "demo_v2"), ("slow", slow)):
        install_stable(stack, bert4rec_build.compiled_folder(factory, bert4rec.DYNAMIC_SIGNATURE, work / names[kind]))
    rng = np.random.default_rng(11)
    entries = []
    for _ in range(64):
        request = live_request(rng)
        entries.append({k: {"content": v.reshape(-1).tolist(), "shape": list(v.shape[1:])} for k, v in request.items()})
    data = work / "live_mix.json"
    data.write_text(json.dumps({"data": entries}))
    load = LoadSettings(concurrency=1, window_ms=1000, stability_pct=RELAXED_STABILITY_PCT)
    url = stack.replicas[0].http_url
    ratios: dict[str, list[float]] = {"p99": [], "mean": []}
    for _ in range(rounds):
        runs = {kind: perf.measure(url, name, data, load) for kind, name in names.items()}
        figures = {k: (np.percentile(r.latencies_us, 99), r.latencies_us.mean()) for k, r in runs.items()}
        ratios["p99"].append(figures["slow"][0] / figures["stable"][0])
        ratios["mean"].append(figures["slow"][1] / figures["stable"][1])
    return {f"{k}_effect_median_pct": float((np.median(v) - 1) * 100) for k, v in ratios.items()} | {
        "rounds": {k: [float(x) for x in v] for k, v in ratios.items()}
    }


def last_round_p99_effect(decision: dict) -> float | None:
    """The canary's p99 over the stable's in the last round after the switch, over the same in the last round
    before it: Triton's summaries cover the last minute, so this is reported, not decided on."""
    before, after = decision["calibration"][-1:], decision["rounds"][-1:]
    sides = [(r["canary"]["p99_ms"], r["baseline"]["p99_ms"]) for r in before + after]
    if len(sides) < 2 or not all(c and b for c, b in sides):
        return None
    return (sides[1][0] / sides[1][1]) / (sides[0][0] / sides[0][1]) - 1


def aa_noise(decisions: list[dict]) -> dict[str, float]:
    """The A/A rounds' log mean-latency ratio (canary over stable): its SD before and after the switch, and the
    mean before it (how much slower the canary replica is by itself)."""
    out = {}
    for key in ("calibration", "rounds"):
        logs = [
            np.log(r["canary"]["mean_ms"] / r["baseline"]["mean_ms"])
            for d in decisions
            if d["kind"] == "aa"
            for r in d[key]
            if r["counted"]
        ]
        if len(logs) > 2:
            out[f"{key}_log_ratio_sd"] = float(np.std(logs, ddof=1))
            out[f"{key}_log_ratio_mean"] = float(np.mean(logs))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--aa", type=int, default=40)
    parser.add_argument("--slow", type=int, default=20)
    parser.add_argument("--slow-window", type=int, choices=(6, 7), default=7, help="the slow candidate's window")
    parser.add_argument("--rate", type=float, default=300.0, help="live requests a second to each replica")
    parser.add_argument("--round-s", type=float, default=3.0)
    parser.add_argument("--min-rounds", type=int, default=8)
    parser.add_argument("--max-bake-s", type=float, default=60.0)
    parser.add_argument("--max-latency-regression-pct", type=float, default=10.0)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/canary_quality.json"))
    parser.add_argument("--resume", action="store_true", help="go on from the decisions already in --out")
    parser.add_argument(
        "--effect-only", action="store_true", help="measure only the slow candidate's own effect on the live mix"
    )
    args = parser.parse_args()
    if args.effect_only:
        with EmbeddedStack(replicas=1, gate=True) as stack:
            work = Path(tempfile.mkdtemp(prefix="canary-effect-"))
            effect = live_mix_effect(stack, work, slow_factory(args.slow_window))
        out = args.out.with_name(f"{args.out.stem}_live_mix_effect_window_{args.slow_window}.json")
        out.write_text(
            json.dumps(
                {"command": " ".join(["python -m benchmarks.canary_quality", *sys.argv[1:]]), **effect}, indent=2
            )
        )
        print(json.dumps(effect, indent=2))
        return
    settings = CanarySettings(
        round_s=args.round_s,
        min_rounds=args.min_rounds,
        max_bake_s=args.max_bake_s,
        max_latency_regression_pct=args.max_latency_regression_pct,
    )
    work = Path(tempfile.mkdtemp(prefix="canary-quality-"))
    folders = {
        kind: bert4rec_build.compiled_folder(factory, bert4rec.DYNAMIC_SIGNATURE, work / kind / MODEL)
        for kind, factory in (("aa", "demo_v2"), ("slow", slow_factory(args.slow_window)))
    }
    plan = [str(k) for k in np.random.default_rng(0).permutation(["aa"] * args.aa + ["slow"] * args.slow)]
    previous = json.loads(args.out.read_text()) if args.resume else {}
    decisions: list[dict] = previous.get("decisions", [])
    runs: list[dict] = previous.get("runs", [])  # each stack's live clients: requests answered, failed
    with EmbeddedStack(replicas=2, gate=True) as stack:
        install_stable(stack, folders["aa"])
        urls, cpus = [s.http_url for s in stack.replicas], stack.replica_cpus
        with LiveTraffic(urls, MODEL, live_request, LIVE_OUTPUTS, rate_hz=args.rate, cpus=cpus) as clients:
            runs.append({"first_decision": len(decisions) + 1})
            for i, kind in list(enumerate(plan))[len(decisions) :]:
                folder = shutil.copytree(folders[kind], work / f"{i}" / MODEL)
                decisions.append({"kind": kind, **decide(stack, folder, f"canary-quality-{i}", settings)})
                # Triton downloads every version folder on each load: keep two, as a production repository would
                ModelRepository(repository(stack), stack.s3).retire(MODEL, keep=2)
                d = decisions[-1]
                print(i + 1, kind, d["decision"], f"{d['seconds']:.1f} s", "; ".join(d["reasons"]), flush=True)
                runs[-1].update(client_requests=clients.total, client_failures=len(clients.failures))
                args.out.parent.mkdir(parents=True, exist_ok=True)
                args.out.write_text(json.dumps({"runs": runs, "decisions": decisions}, indent=2, default=str))
    seconds = [d["seconds"] for d in decisions]
    slow = [d for d in decisions if d["kind"] == "slow"]
    summary = {
        "aa": sum(d["kind"] == "aa" for d in decisions),
        "aa_reverted": sum(d["kind"] == "aa" and d["outcome"] == "reverted" for d in decisions),
        "slow": len(slow),
        "slow_caught": sum(d["outcome"] == "reverted" for d in slow),
        "median_s": statistics.median(seconds),
        "worst_s": max(seconds),
        "slow_mean_latency_effect_median_pct": _median_pct([_latency(d) for d in slow]),
        "slow_p99_effect_median_pct": _median_pct([last_round_p99_effect(d) for d in slow]),
        "runs": runs,
        **aa_noise(decisions),
        "slow_window": args.slow_window,
        "command": " ".join(["python -m benchmarks.canary_quality", *sys.argv[1:]]),
        "settings": settings.__dict__,
    }
    args.out.write_text(json.dumps({"summary": summary, "runs": runs, "decisions": decisions}, indent=2, default=str))
    print(json.dumps(summary, indent=2, default=str))


def _latency(decision: dict) -> float | None:
    return next((e["estimate"] for e in decision["effects"] if e["name"] == "mean latency"), None)


def _median_pct(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return float(np.median(known) * 100) if known else None


if __name__ == "__main__":
    main()
