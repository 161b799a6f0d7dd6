"""What the ensemble's hops cost: the BERT4Rec served as the users have it (Python pre step -> model ->
Python post step), the same ensemble with its steps compiled to TorchScript (`bert4rec.CataloguePre` and
`CataloguePost`, served by the PyTorch backend: no Python process between the steps), and the model with
the pre/post work folded into its forward (`bert4rec.WithCatalogue`: catalogue ids in and out, one model).

    .venv/bin/python benchmarks/ensemble_hops.py                                   # CPU, demo size
    python3 benchmarks/ensemble_hops.py --device cuda --size users --precision fp16 --concurrency 1 16 --rates 10000

Every form is exported and compiled by the real steps (the folded one and the steps on realistic golden
samples), served side by side by one embedded Triton, each with one instance and dynamic batching, and must
give the same answers to the same histories before it is timed. Then, for each concurrency and each fixed
rate (`--rates`), the forms take turns, `--repeats` perf_analyzer runs each (1 s windows, the same
histories); medians of throughput, p50 and p99, and each step's mean queue and execution per run (Triton's
statistics). Writes benchmarks/results/ensemble_hops_<device>_<size>_<precision>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.served_points import step_breakdown
from components.model.settings import CompileSettings
from components.serving import perf
from components.serving.triton_admin import TritonAdmin
from pipelines.samples import bert4rec
from pipelines.samples.bert4rec import build as bert4rec_build
from pipelines.stack import PRODUCTION_PREFIX, EmbeddedStack
from tests.models import upload_folder

HERE = Path(__file__).parent
OUTPUTS = ["recommended", "scores"]


def check_same_answers(admin: TritonAdmin, names: list[str], histories: np.ndarray, int_mismatch: float) -> dict:
    """Every form answers the same histories as the first: the same items (fp16 may swap near-tied
    neighbours, up to `int_mismatch` of them) and scores within 2e-3."""
    first, *others = [admin.infer_in_batches(name, {"history": histories}, OUTPUTS, 8) for name in names]
    mismatch = max(float(np.mean(first["recommended"] != other["recommended"])) for other in others)
    score_gap = max(float(np.max(np.abs(first["scores"] - other["scores"]))) for other in others)
    if mismatch > int_mismatch or score_gap > 2e-3:
        raise SystemExit(f"the forms answer differently: {mismatch:.1%} of items differ, scores up to {score_gap:.2g}")
    return {"items_differing": mismatch, "max_score_difference": score_gap}


def _median(runs: list, figure) -> float | None:
    return float(statistics.median(figure(r) for r in runs)) if runs else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", default="fp32", choices=("fp32", "fp16"))
    parser.add_argument("--size", default="demo", choices=("demo", "users"))
    parser.add_argument("--concurrency", type=int, nargs="*", default=[1, 4])
    parser.add_argument("--rates", type=float, nargs="*", default=[], help="fixed request rates too, e.g. 10000")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    users = args.size == "users"
    size = bert4rec.USERS if users else bert4rec.DEMO
    tolerance = bert4rec.USERS_FP16_TOLERANCE if users and args.precision == "fp16" else None
    chosen = CompileSettings(
        precision=args.precision, device=args.device, int_mismatch=tolerance.int_mismatch if tolerance else None
    )
    forms = {"ensemble": "hops", "compiled steps": "hopsc", "folded": "hops_folded"}
    report: dict = {"command": " ".join(sys.argv), "torch": torch.__version__, "cpus": os.cpu_count(), "rows": []}
    with tempfile.TemporaryDirectory() as tmp, EmbeddedStack(replicas=1) as stack:
        tmp_path = Path(tmp)
        factory = "users_v1" if users else "bert4rec_v1"
        bundles = [
            bert4rec_build.build_bundle(tmp_path / name, factory, name, chosen, compiled)
            for name, compiled in (("hops", False), ("hopsc", True))
        ]
        folded = bert4rec_build.build_folded(
            tmp_path / "hops_folded", "users_folded_v1" if users else "folded_v1", chosen
        )
        server = stack.replicas[0]
        histories = bert4rec.histories(64, seed=3, size=size)
        data = perf.write_input_data({"history": histories[:16]}, tmp_path / "input.json", batched=True)
        with TritonAdmin(server.http_url) as admin:
            members = [p for b in bundles for p in sorted(b.iterdir()) if p.name != b.name]
            for folder in [*members, *(b / b.name for b in bundles), folded]:
                upload_folder(stack.s3.client(), stack.bucket, folder, f"{PRODUCTION_PREFIX}/{folder.name}")
                admin.load(folder.name)
            report["answers"] = check_same_answers(
                admin, list(forms.values()), histories, tolerance.int_mismatch if tolerance else 0.0
            )
            loads = [{"concurrency": c} for c in args.concurrency] + [{"request_rate": r} for r in args.rates]
            for point in loads:
                load = perf.LoadSettings(**point, window_ms=1000, stability_pct=20)
                label = (
                    f"conc {point['concurrency']:>5}" if "concurrency" in point else f"rate {point['request_rate']:>5g}"
                )
                for name in forms.values():  # warm-up, unrecorded
                    perf.measure(server.http_url, name, data, load)
                runs: dict[str, list] = {form: [] for form in forms}
                for _round in range(args.repeats):  # the forms take turns: each sees the same machine
                    for form, name in forms.items():
                        before = admin.statistics()
                        run = perf.measure(server.http_url, name, data, load)
                        runs[form].append((run, step_breakdown(before, admin.statistics())))
                for form, measured in runs.items():
                    ok = [run for run, _ in measured if run.ok]
                    row = {
                        "form": form,
                        **point,
                        "runs_ok": len(ok),
                        "failures": [run.reason for run, _ in measured if not run.ok],
                        "throughput": _median(ok, lambda r: r.points[0].throughput),
                        "p50_ms": _median(ok, lambda r: np.percentile(r.latencies_us, 50) / 1e3),
                        "p99_ms": _median(ok, lambda r: np.percentile(r.latencies_us, 99) / 1e3),
                        "steps_per_run": [steps for _, steps in measured],
                    }
                    report["rows"].append(row)
                    print(
                        f"  {form:<14} {label}: {row['throughput'] or 0:>8,.0f} infer/s  "
                        f"p50 {row['p50_ms'] or 0:6.2f}  p99 {row['p99_ms'] or 0:6.2f} ms  {row['failures'] or ''}",
                        flush=True,
                    )
    out = HERE / "results" / f"ensemble_hops_{args.device.split(':')[0]}_{args.size}_{args.precision}.json"
    out.write_text(json.dumps(report, indent=2, default=float))
    print(f"answers: {report['answers']}\nwrote {out}")


if __name__ == "__main__":
    main()
