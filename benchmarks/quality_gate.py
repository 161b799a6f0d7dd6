"""How often the quality check decides right on this machine, for the demo's trained BERT4Rec, and what it costs.

    .venv/bin/python -m benchmarks.quality_gate --pairs 20 --rows 10000 --out benchmarks/results/quality_gate.json

Models: `DemoRecommender`s trained (pipelines/samples/bert4rec/training.py) on the same synthetic sessions with
seeds 0..pairs, each compiled to TorchScript and served by Triton's PyTorch backend on the embedded stack's gate.
- A/A: seed i stable, seed i + 1 the candidate: as good by construction; a `fail` is a false fail.
- Degraded: seed i stable, seed i + 1 with a known drop: for `--drop-share` of the rows (chosen by a hash of the
  history, so the same rows whoever asks) its top 10 is replaced by ten other items, so its hit rate@10 loses
  about drop_share x its hit rate there; a `pass` (or inconclusive) is a miss.
Each decision is the quality step as a release runs it: candidate staged, stable loaded beside it, `--rows`
held-out sessions through both, the spec below (hit rate@10 and NDCG@10, the default limit: 2% of stable's value).
Then the time the check adds to a release, at 10,000 and 100,000 rows. Results go into the JSON as they come.
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

from components.release.promote import reject
from components.release.publish import publish
from components.release.quality import quality
from components.release.quality_spec import QualitySpec
from components.release.stage import stage
from pipelines.samples import bert4rec
from pipelines.samples.bert4rec import training
from pipelines.samples.bert4rec.build import compiled_folder
from pipelines.stack import EmbeddedStack
from tests.release_helpers import install_stable, repository

MODEL = "bert4rec_quality"
SPEC = QualitySpec.model_validate(
    {
        "metrics": [
            {"metric": "hit_rate", "k": 10, "output": "topk_indices", "label": "next_item"},
            {"metric": "ndcg", "k": 10, "output": "topk_indices", "label": "next_item"},
        ],
        "slice": "segment",
    }
)
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
    published = publish(candidate, repository(stack), s3=stack.s3)
    staged = stage(repository(stack), MODEL, published.version, stack.gate.http_url, s3=stack.s3)
    assert staged.accuracy_passed, staged.load_error
    result = quality(repository(stack), MODEL, published.version, stack.gate.http_url, data, SPEC, s3=stack.s3)
    reject(repository(stack), MODEL, published.version, result.decision, result.reasons, stack.gate.http_url, s3=stack.s3)
    whole = {m["metric"]: m for m in result.metrics if m["slice"] == ""}
    return {
        "decision": result.decision,
        "seconds": result.seconds,
        "hit_rate": {k: whole["hit_rate@10"][k] for k in ("candidate", "stable", "difference", "difference_interval")},
        "effects": [e["text"] for e in result.effects],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--rows", type=int, default=10_000)
    parser.add_argument("--cost-rows", type=int, nargs="*", default=[10_000, 100_000])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/quality_gate.json"))
    args = parser.parse_args()
    report: dict = {"command": " ".join(["python -m benchmarks.quality_gate", *__import__("sys").argv[1:]])}
    report |= {"rows": args.rows, "drop_share": DROP_SHARE, "spec": SPEC.model_dump(exclude_defaults=True)}
    report |= {"trained": [], "aa": [], "degraded": [], "cost": []}
    save = lambda: args.out.write_text(json.dumps(report, indent=1))  # noqa: E731
    with tempfile.TemporaryDirectory(prefix="tritonship-quality-bench-") as tmp, EmbeddedStack(2, gate=True) as stack:
        work = Path(tmp)
        held_out = training.eval_set(max(args.rows, *args.cost_rows), seed=1000)
        for rows in sorted({args.rows, *args.cost_rows}):
            training.write_eval({k: v[:rows] for k, v in held_out.items()}, work / f"eval-{rows}.parquet")
            stack.s3.client().upload_file(str(work / f"eval-{rows}.parquet"), stack.bucket, f"eval/{rows}.parquet")
        data = lambda rows: f"s3://{stack.bucket}/eval/{rows}.parquet"  # noqa: E731
        folders, degraded = [], []
        for seed in range(args.pairs + 1):
            started = time.monotonic()
            model = training.train(seed)
            checkpoint = work / f"seed{seed}.pt"
            training.save_checkpoint(model, checkpoint)
            report["trained"].append(
                {"seed": seed, "seconds": round(time.monotonic() - started, 1),
                 "hit_rate_eager": training.hit_rate_at_10(model, {k: v[:2000] for k, v in held_out.items()})}
            )  # fmt: skip
            folders.append(_folder(work, checkpoint, f"seed{seed}", False))
            if seed:
                wrapped = Degraded(bert4rec.LongHistoryCost(model))
                torch.save(wrapped.state_dict(), work / f"degraded{seed}.pt")
                degraded.append(_folder(work, work / f"degraded{seed}.pt", f"degraded{seed}", True))
            save()
        for i in range(args.pairs):
            report["aa"].append(_decide(stack, folders[i], folders[i + 1], data(args.rows)) | {"seeds": [i, i + 1]})
            report["degraded"].append(_decide(stack, folders[i], degraded[i], data(args.rows)) | {"seeds": [i, i + 1]})
            save()
            print(f"pair {i}: A/A {report['aa'][-1]['decision']}, degraded {report['degraded'][-1]['decision']}")
        for rows in args.cost_rows:
            report["cost"].append(_decide(stack, folders[0], folders[1], data(rows)) | {"rows": rows})
            save()
    count = lambda key, what: sum(d["decision"] == what for d in report[key])  # noqa: E731
    report["summary"] = {
        "aa_false_fail": f"{count('aa', 'fail')} of {len(report['aa'])}",
        "aa_inconclusive": count("aa", "inconclusive"),
        "degraded_caught": f"{count('degraded', 'fail')} of {len(report['degraded'])}",
        "degraded_drop_points": float(np.mean([-d["hit_rate"]["difference"] for d in report["degraded"]]) * 100),
        "aa_difference_points_sd": float(np.std([d["hit_rate"]["difference"] for d in report["aa"]]) * 100),
        "seconds_by_rows": {c["rows"]: c["seconds"] for c in report["cost"]},
    }
    save()
    print(json.dumps(report["summary"], indent=1))


if __name__ == "__main__":
    main()
