"""Replays recorded rounds through the gate's and the canary's sequential decisions: the previous design (a 90%
fixed-sample Yuen interval on the 20% trimmed mean, looked at after every round) against the anytime-valid
intervals of components/release/effects.py, on the same replays.

The gate's rounds are the per-round p99 log ratios of every recorded A/A duet (benchmarks/results/gate_quality*.json,
one pool per file: quiet, busy, GPU, Python-backend stand-in and PyTorch backend); the canary's are the per-round
mean-latency log ratios of the 40 recorded A/A canaries (canary_quality.json), before and after their switch. Each
replay draws a decision's rounds from one pool with replacement, centred (an exact A/A) and then shifted: by 0
(false fails), by exactly the limit (false passes: a candidate at its limit must not pass) and by +25% (power).

    .venv/bin/python -m benchmarks.sequential_replay --replays 1000 --out benchmarks/results/sequential_replay.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from scipy import stats

from components.release.effects import sequential_difference, sequential_interval

RESULTS = Path(__file__).parent / "results"
LIMIT = np.log(1.10)  # the product's default p99 limit (+10%) and the canary's mean-latency limit
SLOWER = np.log(1.25)
MIN_ROUNDS, GATE_ROUNDS = 5, 30  # the gate: 5 rounds before the first look; ~4 s a round, a 120 s budget
CANARY_BEFORE, CANARY_ROUNDS = 5, 20
CONFIDENCE = 0.9
Interval = Callable[[np.ndarray], tuple[float, float, float]]


def yuen(values: np.ndarray, confidence: float = CONFIDENCE, trim: float = 0.2) -> tuple[float, float, float]:
    """The previous design: 20% trimmed mean and Yuen's fixed-sample t-interval."""
    x = np.sort(values)
    n, g = x.size, int(trim * x.size)
    kept = n - 2 * g
    mean = float(x[g : n - g].mean())
    winsorized = np.clip(x, x[g], x[n - g - 1])
    half = stats.t.ppf(0.5 + confidence / 2, kept - 1) * np.sqrt((n - 1) * winsorized.var(ddof=1) / (kept * (kept - 1)))
    return mean, mean - half, mean + half


def yuen_difference(after: np.ndarray, before: np.ndarray) -> tuple[float, float, float]:
    mean = float(stats.trim_mean(after, 0.2) - stats.trim_mean(before, 0.2))
    low, high = stats.ttest_ind(after, before, equal_var=False, trim=0.2).confidence_interval(CONFIDENCE)
    return mean, float(low), float(high)


GATE_METHODS: dict[str, Interval] = {"fixed-sample Yuen (previous)": yuen, "anytime-valid (now)": sequential_interval}
CANARY_METHODS = {"fixed-sample Yuen (previous)": yuen_difference, "anytime-valid (now)": sequential_difference}


def decide(rounds: np.ndarray, interval: Interval, first_look: int) -> tuple[str, int]:
    """The gate's rule: after every round from `first_look`, fail when the interval lies beyond the limit, pass
    when it lies within, else another round; inconclusive when the rounds run out."""
    for n in range(first_look, rounds.size + 1):
        _, low, high = interval(rounds[:n])
        if low > LIMIT:
            return "fail", n
        if high <= LIMIT:
            return "pass", n
    return "inconclusive", rounds.size


def tally(decisions: list[tuple[str, int]]) -> dict[str, float]:
    verdicts = [d for d, _ in decisions]
    return {
        "replays": len(decisions),
        "pass": verdicts.count("pass"),
        "fail": verdicts.count("fail"),
        "inconclusive": verdicts.count("inconclusive"),
        "median_rounds": float(np.median([n for _, n in decisions])),
    }


def gate_pools() -> dict[str, np.ndarray]:
    pools = {}
    for path in sorted(RESULTS.glob("gate_quality*.json")):
        for result in json.loads(path.read_text())["results"]:
            if result.get("design", "duet") != "duet" or result["injected_pct"] != 0:
                continue
            rounds = [r for t in result["trial_details"] for r in t.get("round_p99_log_ratios") or []]
            if len(rounds) >= 40:
                pools[path.stem] = np.asarray(rounds)
    return pools


def canary_pools() -> tuple[np.ndarray, np.ndarray]:
    """The recorded A/A canaries' per-round log ratios of mean latency (canary over stable), before and after."""

    def ratios(rounds: list[dict]) -> list[float]:
        return [
            float(np.log(r["canary"]["mean_ms"] / r["baseline"]["mean_ms"]))
            for r in rounds
            if r["counted"] and r["canary"]["mean_ms"] and r["baseline"]["mean_ms"]
        ]

    decisions = [d for d in json.loads((RESULTS / "canary_quality.json").read_text())["decisions"] if d["kind"] == "aa"]
    before = [x for d in decisions for x in ratios(d["calibration"])]
    after = [x for d in decisions for x in ratios(d["rounds"][1:])]
    return np.asarray(before), np.asarray(after)


def replay_gate(pool: np.ndarray, replays: int, rng: np.random.Generator) -> dict:
    centred = pool - pool.mean()
    out: dict = {"rounds_recorded": int(pool.size), "round_sd": float(pool.std(ddof=1))}
    draws = [rng.choice(centred, GATE_ROUNDS) for _ in range(replays)]
    for case, shift in (("equal", 0.0), ("at the limit", LIMIT), ("25% slower", SLOWER)):
        out[case] = {name: tally([decide(d + shift, m, MIN_ROUNDS) for d in draws]) for name, m in GATE_METHODS.items()}
    return out


def replay_canary(before: np.ndarray, after: np.ndarray, replays: int, rng: np.random.Generator) -> dict:
    before, after = before - before.mean(), after - after.mean()
    out: dict = {"rounds_recorded": {"before": int(before.size), "after": int(after.size)}}
    draws = [(rng.choice(before, CANARY_BEFORE), rng.choice(after, CANARY_ROUNDS)) for _ in range(replays)]
    for case, shift in (("equal", 0.0), ("at the limit", LIMIT), ("25% slower", SLOWER)):
        out[case] = {
            name: tally([decide(a + shift, lambda x, b=b, m=m: m(x, b), MIN_ROUNDS) for b, a in draws])
            for name, m in CANARY_METHODS.items()
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=RESULTS / "sequential_replay.json")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    report = {
        "command": f".venv/bin/python -m benchmarks.sequential_replay --replays {args.replays} --seed {args.seed}",
        "limit": "+10% (p99 at the gate, mean latency at the canary); 90% two-sided intervals",
        "gate": {name: replay_gate(pool, args.replays, rng) for name, pool in gate_pools().items()},
        "canary": replay_canary(*canary_pools(), args.replays, rng),
    }
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for name, pool in report["gate"].items():
        for case in ("equal", "at the limit", "25% slower"):
            print(f"gate {name:45s} sd {pool['round_sd']:.3f} {case:13s}", json.dumps(pool[case]))
    for case in ("equal", "at the limit", "25% slower"):
        print(f"canary {case:13s}", json.dumps(report["canary"][case]))


if __name__ == "__main__":
    main()
