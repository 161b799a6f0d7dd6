"""The users' BERT4Rec as an AOTInductor package (`torch_aoti`) against TorchScript (`pytorch_libtorch`), both
served by one Triton in one run: does the aoti target reach the H200 goals (the model alone >= 20,000/s and the
ensemble's work >= 10,000/s, each at p99 <= 4 ms)?

    python3 benchmarks/gpu_aoti.py                      # the GPU machine: bash benchmarks/gpu_served_speed.sh aoti
    .venv/bin/python benchmarks/gpu_aoti.py --device cpu --precision fp32 --size demo --rates 100 200   # CPU smoke

Each release is compiled from the sample's weights by the export and compile steps, once per target (`--targets`),
on `--device` at `--precision`:
- `model`: the model step alone (item indices and the mask's position in, top-k out; `users_v1`);
- `folded`: the ensemble's work as one model, its pre/post lookups folded into the forward (catalogue ids in and
  out; `bert4rec.WithCatalogue`, `users_folded_v1`).

Per folder, first in this process with no server: one call at each `--batches` size (the median of 100 after 20,
inputs on the device, outputs back on the host) and how long the GPU was busy inside it (torch.profiler: its
kernels' and copies' durations summed, and their count). Then every folder is published to the embedded S3, staged
dark on the gate (accuracy against eager), installed in production and loaded (a release's targets together) on one
server per `--metrics` setting (`summaries`: the stack's replica, which keeps Triton's latency summaries; `none`:
one more server without them) with one serving setting (the signature's max batch, dynamic batching with
`--queue-delay-us`; TorchScript on `--torchscript-instances` GPU instances, the package on `--aoti-instances`,
each running its own loader with the r26.05 loader-per-instance patch, docs/design.md section 5), and measured one
at a time with
perf_analyzer over HTTP: each offered rate of `--rates`, then concurrency 1 (benchmarks/served_points.py:
throughput, p50, p99, the GPU's utilisation, the batch Triton formed and what one execution cost). The JSON is
rewritten after each folder, so a run stopped early (LIMIT_S in gpu_served_speed.sh) keeps what it measured.
Writes benchmarks/results/gpu_aoti_<device>_<size>_<precision>_<releases>[_<targets> unless both][_aoti<N>x unless
1].json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.compiled_speed import median_ms
from benchmarks.gpu_bert4rec import load_release
from benchmarks.model_floor import eager, operations
from benchmarks.served_points import best_within, sweep
from components.model import aoti, model_folder
from components.model.model_config import AOTI_PLATFORM, ServingSettings
from components.model.settings import CompileSettings
from components.release.publish import PublishSettings, publish
from components.release.run_context import RunContext
from components.release.stage import read_candidate, stage
from components.repository import ModelRepository
from components.repository.store import PRODUCTION
from components.serving import perf
from components.serving.triton_admin import TritonAdmin
from pipelines.samples import bert4rec
from pipelines.samples.bert4rec import build as bert4rec_build
from pipelines.stack import LATENCY_SUMMARIES, EmbeddedStack

HERE = Path(__file__).parent
FACTORIES = {
    ("users", "model"): "users_v1",
    ("demo", "model"): "bert4rec_v1",
    ("users", "folded"): "users_folded_v1",
    ("demo", "folded"): "folded_v1",
}
GOALS = {"model": (20_000, 4.0), "folded": (10_000, 4.0)}  # infer/s within p99 ms (issue 42)
RUN_ID = "gpu-aoti"
# Triton's --metrics-config settings to serve with: the stack's (latency summaries for promote's canary), and none
# Triton's latency summaries with every default quantile, with only the p99 (what the canary reads: the stack's and
# the chart's production setting), or none.
METRICS = {"summaries": ("summary_latencies=true",), "p99": LATENCY_SUMMARIES, "none": ()}


def build(work: Path, size: str, release: str, target: str, device: str, precision: str) -> model_folder.ModelFolder:
    factory = FACTORIES[size, release]
    users_fp16 = size == "users" and precision == "fp16"
    int_mismatch = bert4rec.USERS_FP16_TOLERANCE.int_mismatch if users_fp16 else None
    chosen = CompileSettings(target=target, precision=precision, device=device, int_mismatch=int_mismatch)
    out = work / f"b4r_{release}_{target}"
    if release == "folded":
        bert4rec_build.build_folded(out, factory, chosen)
    else:
        signature = getattr(bert4rec, factory)().size.signatures()["model"]
        bert4rec_build.compiled_folder(factory, signature, out, chosen)
    return model_folder.read(out)


def host_outputs(folder: model_folder.ModelFolder, device: str) -> Callable[..., list[torch.Tensor]]:
    """The compiled file loaded as the backend loads it, its outputs brought to the host as the server hands them."""
    path = folder.version_dir / model_folder.model_file(folder.config)
    if folder.config.platform == AOTI_PLATFORM:
        return eager(aoti.load_aoti(path, folder.signature, device))
    return eager(torch.jit.load(str(path), map_location=device).eval())


def one_call(folder: model_folder.ModelFolder, device: str, batches: list[int]) -> list[dict]:
    call = host_outputs(folder, device)
    rows = []
    for batch in batches:
        batch = min(batch, folder.config.max_batch_size)
        inputs = [torch.from_numpy(np.resize(a, (batch, *a.shape[1:]))).to(device) for a in folder.golden()[0].values()]
        ms = median_ms(call, inputs, device, repeats=100, warmup=20)
        count, busy_ms = operations(call, inputs, device)
        rows.append({"batch": batch, "ms": round(ms, 3), "operations": count, "gpu_busy_ms": busy_ms})
        busy = "" if busy_ms is None else f", the GPU busy {busy_ms:.3f} ms ({busy_ms / ms:.0%})"
        print(f"  {folder.config.name:<20} batch {batch:>3}: {ms:7.3f} ms, {count:>4} operations{busy}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="fp16", choices=("fp32", "fp16", "bf16"))
    parser.add_argument("--size", default="users", choices=("users", "demo"))
    parser.add_argument("--releases", default="model,folded", help="model, folded, or both")
    parser.add_argument("--targets", default="aoti,torchscript", help="the compile targets, each served")
    parser.add_argument("--rates", type=float, nargs="*", default=[10_000, 20_000])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--queue-delay-us", type=int, default=100)
    parser.add_argument("--metrics", nargs="+", default=["summaries"], choices=METRICS, help="one server per setting")
    parser.add_argument("--torchscript-instances", type=int, default=2, help="the steadiest in run E (README)")
    parser.add_argument("--aoti-instances", type=int, default=1, help="each runs its own loader (patch 6)")
    args = parser.parse_args()
    device = args.device.split(":")[0]
    releases = args.releases.replace(",", "_")
    targets = "" if args.targets == "aoti,torchscript" else "_" + args.targets.replace(",", "_")
    instances = "" if args.aoti_instances == 1 else f"_aoti{args.aoti_instances}x"
    out = HERE / "results" / f"gpu_aoti_{device}_{args.size}_{args.precision}_{releases}{targets}{instances}.json"
    report: dict = {
        "command": " ".join(sys.argv),
        "torch": torch.__version__,
        "machine": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "goals": {release: {"infer_per_s": n, "p99_ms": ms} for release, (n, ms) in GOALS.items()},
        "folders": {},
    }
    started = time.monotonic()

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report | {"seconds": round(time.monotonic() - started)}, indent=2, default=str))

    with tempfile.TemporaryDirectory() as tmp, EmbeddedStack(replicas=1, gate=True) as stack:
        work, repo_uri = Path(tmp), f"s3://{stack.bucket}"
        repo = ModelRepository(repo_uri, stack.s3)
        servers = {  # the replica as the stack starts it, and one more server per other metrics setting
            v: stack.replicas[0]
            if METRICS[v] == LATENCY_SUMMARIES
            else stack.add_triton(f"metrics-{v}", [PRODUCTION], METRICS[v])
            for v in args.metrics
        }
        admins = [TritonAdmin(s.http_url, load_timeout=300) for s in servers.values()]
        for release in args.releases.split(","):
            loaded: dict[str, Path] = {}
            for target in args.targets.split(","):
                t = time.monotonic()
                folder = build(work, args.size, release, target, args.device, args.precision)
                name = folder.config.name
                entry = report["folders"][name] = {"release": release, "target": target}
                entry["build_seconds"] = round(time.monotonic() - t)
                entry["one_call"] = one_call(folder, args.device, args.batches)
                version = publish(
                    RunContext(repo_uri, "", s3=stack.s3, run_id=RUN_ID),
                    PublishSettings(serving_torch=stack.serving_torch),
                    folder=folder.path,
                ).version
                staged = stage(RunContext(repo_uri, name, version, stack.gate.replica, stack.s3, RUN_ID))
                entry["stage"] = {"accuracy_passed": staged.accuracy_passed, "load_error": staged.load_error}
                accuracy = "passed" if staged.accuracy_passed else f"FAILED {staged.load_error or ''}"
                print(f"{name}: staged v{version}, accuracy {accuracy}", flush=True)
                candidate = read_candidate(repo, name, version)
                for member, config in candidate.production_configs().items():
                    repo.copy_to_production(member, version)
                    repo.write_desired_config(member, config, None)
                instances = args.torchscript_instances if target == "torchscript" else args.aoti_instances
                settings = ServingSettings(max_queue_delay_us=args.queue_delay_us, instance_count=instances)
                entry["settings"] = settings.__dict__
                for admin in admins:
                    load_release(admin, repo, name, settings)
                data = perf.write_input_data(candidate.golden_inputs, work / f"{name}.json", batched=True)
                loaded[name] = data
                save()
            # a release's targets are loaded on each server before either is measured, each beside the other
            for variant, served_on in servers.items():
                for name, data in loaded.items():
                    entry = report["folders"][name]
                    print(f"{name}: served with metrics {variant!r}, {entry['settings']}", flush=True)
                    points = sweep(served_on, name, data, ["http"], args.rates, [1])
                    rate, p99 = GOALS[release]
                    best = best_within(points, p99)
                    met = bool(best and best["throughput"] >= rate * 0.99)
                    entry.setdefault("served", {})[variant] = {
                        "metrics_config": list(METRICS[variant]),
                        "points": points,
                        "goal": {"best_within_p99": best, "met": met},
                    }
                    save()
        for admin in admins:
            admin.close()
    print(f"\n{'folder':<22} {'metrics':<10} {'1 call, b1 (GPU busy)':>22} {'conc. 1 p50/p99':>17} ", end="")
    print("  ".join(f"{r:>9,.0f}/s: served, p50/p99" for r in args.rates) + "  goal")
    for name, entry in report["folders"].items():
        first = entry["one_call"][0]
        busy = "" if first["gpu_busy_ms"] is None else f" ({first['gpu_busy_ms']:.3f})"
        for variant, served in entry.get("served", {}).items():
            single = next((p for p in served["points"] if p["concurrency"] == 1), None)
            conc = "-" if single is None else f"{single['p50_ms']:.2f}/{single['p99_ms']:.2f} ms"
            rated = [
                f"{p['throughput'] or 0:>9,.0f}, {p['p50_ms'] or 0:.2f}/{p['p99_ms'] or 0:.2f} ms"
                for p in served["points"]
                if p["request_rate"]
            ]
            met = "met" if served["goal"]["met"] else "not met"
            print(
                f"{name:<22} {variant:<10} {first['ms']:>11.3f} ms{busy:>9} {conc:>17}   "
                + "   ".join(rated)
                + f"  {met}"
            )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
