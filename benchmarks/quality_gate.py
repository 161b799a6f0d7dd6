"""How often the quality check decides right on this machine, for the demo's trained BERT4Rec, and what it costs.

    .venv/bin/python -m benchmarks.quality_gate --pairs 20 --calibration-retrains 8 --rows 10000 \
        --out benchmarks/results/quality_gate.json

Models: `DemoRecommender`s trained (pipelines/samples/bert4rec/training.py) on the same synthetic sessions with
seeds 0..pairs, each compiled to TorchScript and served by Triton's PyTorch backend on the embedded stack's gate.
- A/A: seed i stable, seed i + 1 the candidate: as good by construction; a `fail` is a false fail.
- Degraded: seed i stable, and seed i itself with a known drop the candidate: for DROP_SHARE of the rows (chosen
  by a hash of the history, so the same rows whoever asks) its top 10 is replaced by ten other items, so its hit
  rate@10 loses about DROP_SHARE x its hit rate (3 points); a `pass` (or inconclusive) is a miss.
Each decision is the quality step as a release runs it: candidate staged, stable loaded beside it, `--rows`
held-out sessions through both, judged by two specs (SPECS): hit rate@10 alone, and hit rate@10 and NDCG@10, each at
the default limit (a drop of 2% of stable's value).
Then the same pairs again after a quality calibration (`tritonship calibrate quality`,
components/release/quality/calibration.py) on `--calibration-retrains` more models (seeds 100, 101, ...), which gives
each metric its retrain-to-retrain limit. Then the time the check adds to a release, at 10,000 and 100,000 rows.
Results go into the JSON as they come.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

from components.release.promote.promote import reject
from components.release.publish import publish
from components.release.quality.calibration import calibrate_quality
from components.release.quality.quality import quality
from components.release.quality.spec import QualitySettings, QualitySpec
from components.release.run_context import RunContext
from components.release.stage import stage
from components.serving.replicas import Replica
from pipelines.samples import bert4rec
from pipelines.samples.bert4rec import training
from pipelines.samples.bert4rec.build import compiled_folder
from pipelines.stack import EmbeddedStack
from tests.release_helpers import install_stable, repository

MODEL = "bert4rec_quality"
HIT_RATE = {"metric": "hit_rate", "k": 10, "output": "topk_indices", "label": "next_item"}
NDCG = {"metric": "ndcg", "k": 10, "output": "topk_indices", "label": "next_item"}
# Each decision is judged by both: hit rate@10 alone at the default limit, and with NDCG@10 at the default beside it.
SPECS = {
    "hit_rate": QualitySpec.model_validate({"metrics": [HIT_RATE], "slice": "segment"}),
    "hit_rate_and_ndcg": QualitySpec.model_validate({"metrics": [HIT_RATE, NDCG], "slice": "segment"}),
}
DROP_SHARE = 0.034  # about 3 points of a 0.89 hit rate


class Degraded(nn.Module):
    """The demo model, with the top 10 of a fixed share of rows (by a hash of the history) moved to other items."""

    def __init__(self, model: nn.Module, share: float = DROP_SHARE) -> None:
        super().__init__()
        self.model, self.threshold = model, int(share * 1000)

    def forward(self, item_ids: torch.Tensor, mask_pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        indices, scores = self.model(item_ids, mask_pos)
        chosen = ((item_ids * 7919).sum(dim=1, keepdim=True) % 1000) < self.threshold
        moved = (indices + 250) % bert4rec.DEMO.items + 1  # ten items far from the ranked ones, still valid ids
        return torch.where(chosen, moved, indices), scores


def degraded_factory() -> nn.Module:
    """What the degraded checkpoint loads into (the export step's `module:factory`)."""
    return Degraded(bert4rec.demo_v1()).eval()


def _folder(work: Path, checkpoint: Path, label: str, degraded: bool) -> Path:
    factory = "benchmarks.quality_gate:degraded_factory" if degraded else "demo_v1"
    out = work / label
    out.mkdir()
    return compiled_folder(factory, bert4rec.DYNAMIC_SIGNATURE, out / MODEL, checkpoint=checkpoint)


def _decide(stack: EmbeddedStack, stable: Path, candidate: Path, data: str) -> dict:
    install_stable(stack, stable)
    published = publish(RunContext(repository(stack), "", s3=stack.s3), folder=candidate)
    staged = stage(RunContext(repository(stack), MODEL, published.version, stack.gate.replica, stack.s3))
    assert staged.accuracy_passed, staged.load_error
    outcome: dict = {}
    on_gate = RunContext(repository(stack), MODEL, published.version, Replica("gate", stack.gate.http_url), stack.s3)
    for name, spec in SPECS.items():
        result = quality(on_gate, QualitySettings(eval_data=data, quality_spec=spec.to_json()))
        whole = {m["metric"]: m for m in result.metrics if m["slice"] == ""}
        outcome[name] = {"decision": result.decision, "seconds": result.seconds}
        outcome[name] |= {"effects": [e["text"] for e in result.effects]}
    outcome["hit_rate@10"] = {k: whole["hit_rate@10"][k] for k in ("candidate", "stable", "difference")}
    reject(RunContext(repository(stack), MODEL, published.version, stack.gate.replica, stack.s3), "fail", ["measured"])
    return outcome


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--cost-rows", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--calibration-retrains", type=int, default=8, help="models the quality calibration measures")
    parser.add_argument("--calibration-seed", type=int, default=100, help="the first of their seeds")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/quality_gate.json"))
    args = parser.parse_args()
    report: dict = {"command": " ".join(["python -m benchmarks.quality_gate", *__import__("sys").argv[1:]])}
    report |= {"rows": args.rows, "drop_share": DROP_SHARE}
    report |= {"specs": {n: s.model_dump(exclude_defaults=True) for n, s in SPECS.items()}}
    report |= {"trained": [], "aa": [], "degraded": [], "aa_calibrated": [], "degraded_calibrated": [], "cost": []}
    save = lambda: args.out.write_text(json.dumps(report, indent=1))  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="tritonship-quality-bench-") as tmp, EmbeddedStack(2, gate=True) as stack:
        work = Path(tmp)
        held_out = training.eval_set(max(args.rows, *args.cost_rows), seed=1000)
        for rows in sorted({args.rows, *args.cost_rows}):
            training.write_eval({k: v[:rows] for k, v in held_out.items()}, work / f"eval-{rows}.parquet")
            stack.s3.client().upload_file(str(work / f"eval-{rows}.parquet"), stack.bucket, f"eval/{rows}.parquet")
        data = lambda rows: f"s3://{stack.bucket}/eval/{rows}.parquet"  # noqa: E731
        folders, degraded, calibration_folders = [], [], []
        calibration_seeds = range(args.calibration_seed, args.calibration_seed + args.calibration_retrains)
        for seed in [*range(args.pairs + 1), *calibration_seeds]:
            started = time.monotonic()
            model = training.train(seed)
            checkpoint = work / f"seed{seed}.pt"
            training.save_checkpoint(model, checkpoint)
            report["trained"].append(
                {"seed": seed, "seconds": round(time.monotonic() - started, 1),
                 "hit_rate_eager": training.hit_rate_at_10(model, {k: v[:2000] for k, v in held_out.items()})}
            )  # fmt: skip
            (calibration_folders if seed in calibration_seeds else folders).append(
                _folder(work, checkpoint, f"seed{seed}", False)
            )
            if seed < args.pairs:
                wrapped = Degraded(bert4rec.LongHistoryCost(model))
                torch.save(wrapped.state_dict(), work / f"degraded{seed}.pt")
                degraded.append(_folder(work, work / f"degraded{seed}.pt", f"degraded{seed}", True))
            save()
        for suffix in ("", "_calibrated"):
            if suffix:
                versions = [
                    publish(RunContext(repository(stack), "", s3=stack.s3), folder=f).version
                    for f in calibration_folders
                ]
                on_gate = RunContext(repository(stack), MODEL, gate=stack.gate.replica, s3=stack.s3)
                spec = SPECS["hit_rate_and_ndcg"].to_json()
                found = calibrate_quality(
                    on_gate, QualitySettings(eval_data=data(args.rows), quality_spec=spec), versions
                )
                report["calibration"] = found.to_dict() | {"seeds": list(calibration_seeds)}
                print(f"calibrated: { ({k: v.max_drop_pct for k, v in found.metrics.items()}) }")
            for i in range(args.pairs):
                aa = _decide(stack, folders[i], folders[i + 1], data(args.rows)) | {"seeds": [i, i + 1]}
                worse = _decide(stack, folders[i], degraded[i], data(args.rows)) | {"seeds": [i, i]}
                report["aa" + suffix].append(aa)
                report["degraded" + suffix].append(worse)
                save()
                print(f"pair {i}{suffix}: A/A {aa['hit_rate_and_ndcg']}, degraded {worse['hit_rate_and_ndcg']}")
        for rows in args.cost_rows:
            report["cost"].append(_decide(stack, folders[0], folders[1], data(rows)) | {"rows": rows})
            save()
    count = lambda key, spec, what: sum(d[spec]["decision"] == what for d in report[key])  # noqa: E731
    report["summary"] = {
        spec + suffix: {
            "aa_false_fail": f"{count('aa' + suffix, spec, 'fail')} of {len(report['aa' + suffix])}",
            "aa_inconclusive": count("aa" + suffix, spec, "inconclusive"),
            "degraded_caught": f"{count('degraded' + suffix, spec, 'fail')} of {len(report['degraded' + suffix])}",
        }
        for spec in SPECS
        for suffix in ("", "_calibrated")
    }
    differences = lambda key: [d["hit_rate@10"]["difference"] * 100 for d in report[key]]  # noqa: E731
    report["summary"] |= {
        "degraded_drop_points_mean": float(np.mean(differences("degraded"))),
        "aa_difference_points_range": [float(min(differences("aa"))), float(max(differences("aa")))],
        "seconds_by_rows": {c["rows"]: c["hit_rate"]["seconds"] for c in report["cost"]},
    }
    save()
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
