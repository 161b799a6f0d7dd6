"""The users' BERT4Rec ensemble on a GPU: released through the real steps, then served as the users had it
(the default) against the config `tritonship tune` chose.

    python3 benchmarks/gpu_bert4rec.py --precision fp16             # on the GPU machine (gpu_served_speed.sh)
    .venv/bin/python benchmarks/gpu_bert4rec.py --device cpu --size demo --rates 100 --concurrency 1 4   # smoke

The release: build the ensemble bundle (catalogue ids -> bert4rec_pre -> BERT4Rec -> bert4rec_post; the
model at the users' size, 50,000 items, hidden 256, 2 layers, 4 heads, sequence length 200, top-10, with
random weights; exported with the default method and compiled to TorchScript on `--device` at
`--precision`), publish it to the embedded S3, stage it dark on the gate (accuracy against the eager
reference), tune it (one setting for every member, the pre/post steps with an instance count of their own, at
concurrency `--tune-concurrency`), gate it (a first
release: the absolute limit p99 <= `--gate-p99-ms` at that load) and promote it to the production replica.

Then, on that replica, for each serving config (the users': max_batch_size 1, one instance, no dynamic
batching; and the tuned one) and each served form of the model step that `--forms` names (`torchscript`,
the compiled model; `eager`, the eager nn.Module loaded through Triton's load API with its files): a warm-up
run that is not recorded (the first requests after a load pay for CUDA's and TorchScript's start), then a
request-rate sweep and a
concurrency sweep with perf_analyzer over each protocol `--protocols` names (`http`; `grpc`: perf_analyzer
2.51 sends its `-H` header over HTTP only, so with gRPC the stack leaves the model-config API open, which
perf_analyzer reads; load and unload stay locked). Per point: throughput, p99,
the GPU's utilisation and memory (Triton's metrics endpoint; NVML when Triton reports none) and, per
ensemble step, its mean queue and compute time and batch size, and what one execution costs inside the
backend (input, infer, output; Triton's statistics API): where the time goes. Beside them, the compiled
model.pt alone in this process at batch 1 to 256 (no server): the reference for the model step's infer.
`--instances 1x4 2x4:off` also serves the tuned settings with other instance counts (model x each step),
and with the TorchScript profiling executor on or off; `--no-users` leaves the users' config out.
Writes benchmarks/results/gpu_bert4rec_<device>_<precision>[_<forms>][_<protocols>][_instances]_pytorch_backend.json
(the files without `_pytorch_backend` were measured with the model step in the Python backend).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components import admin_key, ensemble, model_folder, perf, server_metrics
from components.gate import gate
from components.model_config import ServingSettings
from components.promote import promote
from components.publish import publish
from components.replicas import Replica
from components.repository import ModelRepository
from components.results import TuneResult
from components.settings import RELAXED_STABILITY_PCT, GateSettings, Thresholds
from components.stage import read_candidate, stage
from components.triton_admin import TritonAdmin, TritonError
from components.tune import GateBench, TuneSettings, tune
from pipelines.samples import bert4rec
from pipelines.stack import EmbeddedStack

HERE = Path(__file__).parent
USERS_DEFAULT = ServingSettings(max_batch_size=1, dynamic_batching=False, instance_count=1)  # as the users had it
WINDOW_MS = 1000
RATE_THREADS = 128  # enough client threads for 30,000 requests/s of a few milliseconds each
USERS_RATES = [1500, 2000, 2500, 3000]  # the users' own load: perf_analyzer --request-rate-range 1500:3000:500
PLAIN_BATCHES = [1, 8, 32, 128, 256]


def load_ensemble(
    admin: TritonAdmin, repo: ModelRepository, name: str, settings: ServingSettings | None, eager: dict | None = None
) -> None:
    """(Re)load the promoted ensemble on a replica: every member with `settings` (None: as promoted), the
    model step as the eager module when `eager` gives its files."""
    config, _ = repo.desired_config(name)
    members = {m: repo.desired_config(m)[0] for m in ensemble.member_names(config)}
    if settings is not None:
        config, members = ensemble.with_serving_settings(config, members, settings)
    files = {}
    if eager is not None:
        model_step = next(m for m in members if m.endswith("_model"))  # its config was read for this load alone
        for key, value in eager["parameters"].items():
            members[model_step].parameters[key].string_value = value
        files[model_step] = eager["files"]
    admin.reload_ensemble(name, config, members, files=files)
    for member, member_files in files.items():
        # Loading the ensemble loads its members from the repository again, and a member loaded from given
        # files comes back as the repository has it (the compiled model, the promoted config); loaded again
        # once the ensemble is, it stays (checked: the served config carries the eager step's parameters).
        admin.load(member, members[member], member_files)
        admin.wait_ready(member)
        if "factory" not in admin.model_config(member).get("parameters", {}):
            raise TritonError(f"{member} is not served as the eager module after loading it with its files")


def eager_files(factory: str, precision: str, version: int) -> dict:
    """The eager nn.Module as the model step: benchmarks/served/eager_model.py and the factory's weights."""
    module, _, function = factory.partition(":")
    model = getattr(__import__(module, fromlist=[function]), function)()
    with tempfile.TemporaryDirectory() as tmp:
        torch.save(model.state_dict(), Path(tmp) / "state_dict.pt")
        weights = (Path(tmp) / "state_dict.pt").read_bytes()
    return {
        "parameters": {"factory": factory, "precision": precision},
        "files": {
            f"file:{version}/model.py": (HERE / "served" / "eager_model.py").read_bytes(),
            f"file:{version}/state_dict.pt": weights,
        },
    }


@contextlib.contextmanager
def gpu_sampler(metrics_url: str) -> Iterator[dict]:
    """Triton's metrics while the block runs; the GPU's own figures (NVML) beside them when Triton has none."""
    figures: dict = {}
    nvml_samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def nvml() -> None:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception:  # no NVML here (a CPU machine)
            return
        while not stop.wait(0.25):
            nvml_samples.append(
                (pynvml.nvmlDeviceGetUtilizationRates(handle).gpu, pynvml.nvmlDeviceGetMemoryInfo(handle).used)
            )

    thread = threading.Thread(target=nvml, daemon=True)
    thread.start()
    with server_metrics.Sampler(metrics_url) as sampler:
        yield figures
    stop.set()
    thread.join(timeout=2)
    figures.update(sampler.summary())
    if "gpu_util_pct_mean" not in figures and nvml_samples:
        figures["nvml_gpu_util_pct_mean"] = statistics.mean(u for u, _ in nvml_samples)
        figures["nvml_gpu_memory_gib_max"] = max(m for _, m in nvml_samples) / 2**30


def step_breakdown(before: dict, after: dict) -> dict:
    """Per model, from two readings of Triton's statistics: requests, mean batch size, mean queue and
    compute (input, infer, output) microseconds per request."""
    old = {m["name"]: m for m in before.get("model_stats", [])}
    out = {}
    for now in after.get("model_stats", []):
        was = old.get(now["name"], {})

        def delta(stat: str, key: str = "ns", now: dict = now, was: dict = was) -> float:
            return float(now.get("inference_stats", {}).get(stat, {}).get(key, 0)) - float(
                was.get("inference_stats", {}).get(stat, {}).get(key, 0)
            )

        count = delta("success", "count")
        executions = float(now.get("execution_count", 0)) - float(was.get("execution_count", 0))
        if count > 0:
            # Triton counts a batch's whole duration for each request in it: per request is per execution
            parts = {part: delta(f"compute_{part}") / count / 1000 for part in ("input", "infer", "output")}
            out[now["name"]] = {
                "requests": int(count),
                "mean_batch": round(count / executions, 2) if executions else None,
                "queue_us": round(delta("queue") / count / 1000, 1),
                "compute_us": round(sum(parts.values()), 1),
                **{f"compute_{part}_us": round(us, 1) for part, us in parts.items()},
            }
    return out


def plain_model_ms(model_file: Path, inputs: dict[str, np.ndarray], device: str, batches: list[int]) -> list[dict]:
    """The compiled model.pt run in this process, no server: the median milliseconds of one batch (inputs
    already on the device, outputs back on the host) at each batch size, the reference for the backend's."""
    from benchmarks.compiled_speed import median_ms

    model = torch.jit.load(str(model_file), map_location=device).eval()
    rows = []
    for batch in batches:
        args = [torch.from_numpy(np.resize(a, (batch, *a.shape[1:]))).to(device) for a in inputs.values()]
        ms = median_ms(model, args, device, repeats=50, warmup=10)
        rows.append({"batch": batch, "ms": round(ms, 3), "infer_per_s": round(batch / ms * 1000)})
        print(f"  plain model.pt, batch {batch:>3}: {ms:6.3f} ms ({batch / ms * 1000:,.0f} infer/s)", flush=True)
    return rows


def measure_point(server, name: str, data: Path, load: perf.LoadSettings) -> dict:
    admin = TritonAdmin(server.http_url)
    before = admin.statistics()
    url = server.grpc_url if load.protocol == "grpc" else server.http_url
    with gpu_sampler(server.metrics_url) as gpu:
        run = perf.measure(url, name, data, load, timeout=120)
    after = admin.statistics()
    point = run.points[0] if run.ok else None
    return {
        "protocol": load.protocol,
        "concurrency": None if load.request_rate else load.concurrency,
        "request_rate": load.request_rate,
        "ok": run.ok,
        "reason": "" if run.ok else run.reason,
        "throughput": point.throughput if point else None,
        "p50_ms": float(np.percentile(run.latencies_us, 50)) / 1000 if run.latencies_us.size else None,
        "p99_ms": float(np.percentile(run.latencies_us, 99)) / 1000 if run.latencies_us.size else None,
        "server_queue_us": point.server_queue_us if point else None,
        "server_compute_us": point.server_compute_us if point else None,
        "gpu": gpu,
        "steps": step_breakdown(before, after),
    }


def sweep(server, name: str, data: Path, args) -> list[dict]:
    steady = {"window_ms": WINDOW_MS, "stability_pct": RELAXED_STABILITY_PCT}
    perf.measure(server.http_url, name, data, perf.LoadSettings(concurrency=max(args.concurrency), **steady))  # warm-up
    points = []
    for protocol in args.protocols.split(","):
        over = steady | {"protocol": protocol}
        loads = [perf.LoadSettings(request_rate=r, max_threads=RATE_THREADS, **over) for r in args.rates]
        loads += [perf.LoadSettings(concurrency=c, **over) for c in args.concurrency]
        for load in loads:
            points.append(measure_point(server, name, data, load))
            p = points[-1]
            at = f"rate {p['request_rate']:g}" if p["request_rate"] else f"conc {p['concurrency']}"
            steps = " ".join(
                f"{step}:q{s['queue_us']:.0f}/c{s['compute_us']:.0f}/b{s['mean_batch']}"
                f"/i{s['compute_input_us']:.0f}+x{s['compute_infer_us']:.0f}+o{s['compute_output_us']:.0f}"
                for step, s in p["steps"].items()
            )
            print(
                f"    {protocol:<4} {at:<11} {p['throughput'] or 0:>9,.0f} infer/s  p50 {p['p50_ms'] or 0:6.2f} "
                f"p99 {p['p99_ms'] or 0:7.2f} ms "
                f"{steps} {p['reason']}",
                flush=True,
            )
    return points


def best_within(points: list[dict], max_p99_ms: float) -> dict | None:
    within = [p for p in points if p["ok"] and p["p99_ms"] is not None and p["p99_ms"] <= max_p99_ms]
    return max(within, key=lambda p: p["throughput"], default=None)


def instance_pair(text: str) -> tuple[int, int, bool | None]:
    """`MxS[:on|:off]`: M model instances and S instances of each pre/post step, both whole numbers of 1 or
    more, and the TorchScript profiling executor on or off (left out: as tuned)."""
    pair, _, executor = text.partition(":")
    model_count, _, step_count = pair.partition("x")
    if not (model_count.isdigit() and step_count.isdigit() and int(model_count) > 0 and int(step_count) > 0) or (
        executor not in ("", "on", "off")
    ):
        raise argparse.ArgumentTypeError(f"{text!r} is not MxS[:on|:off] with whole numbers of 1 or more, e.g. 1x4:off")
    return int(model_count), int(step_count), {"": None, "on": True, "off": False}[executor]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--precision", default="fp16", choices=("fp32", "fp16"))
    parser.add_argument("--size", default="users", choices=("users", "demo"))
    parser.add_argument("--rates", type=float, nargs="*", default=[*USERS_RATES, 10000, 20000, 30000])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 32, 128])
    parser.add_argument(
        "--tune-concurrency", type=int, default=32, help="tune's and the gate's load: 10,000/s at 3.2 ms in flight"
    )
    parser.add_argument(
        "--tune-p99-ms", type=float, default=None, help="tune's p99 limit; default: the default setting's p99 + slack"
    )
    parser.add_argument("--tune-budget", type=int, default=14)
    parser.add_argument(
        "--targets",
        default="ensemble,model",
        help="what perf_analyzer drives: the ensemble, and the model step alone (its own inputs)",
    )
    parser.add_argument("--max-p99-ms", type=float, default=4.0, help="the goal: the best throughput within it")
    parser.add_argument("--gate-p99-ms", type=float, default=50.0, help="the release's limit at the tune load")
    parser.add_argument("--forms", default="torchscript", help="served forms of the model step: torchscript,eager")
    parser.add_argument("--protocols", default="http", help="perf_analyzer's protocols: http,grpc")
    parser.add_argument(
        "--instances",
        nargs="*",
        type=instance_pair,
        default=[],
        metavar="MxS",
        help="also serve the tuned settings with M model instances and S of each step, e.g. 1x4, and the "
        "TorchScript profiling executor on or off, e.g. 2x4:off",
    )
    parser.add_argument(
        "--users", action=argparse.BooleanOptionalAction, default=True, help="serve the users' config too"
    )
    parser.add_argument(
        "--tuned-from",
        type=Path,
        help="an earlier result of this benchmark: serve its tuned "
        "settings instead of tuning again (same model, same machine)",
    )
    args = parser.parse_args()
    factory = "users_v1" if args.size == "users" else "bert4rec_v1"
    name = f"b4r_{args.precision}"
    report: dict = {
        "arguments": vars(args),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "machine": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
    }
    forms = "" if args.forms == "torchscript" else "_" + args.forms.replace(",", "_")
    protocols = "" if args.protocols == "http" else "_" + args.protocols.replace(",", "_")
    suffix = forms + protocols + ("_instances" if args.instances else "")
    out = HERE / "results" / f"gpu_bert4rec_{args.device.split(':')[0]}_{args.precision}{suffix}_pytorch_backend.json"
    grpc = "grpc" in args.protocols.split(",")
    locked = [api for api in admin_key.RESTRICTED_APIS if not (grpc and api == "model-config")]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedStack(replicas=1, gate=True, locked_apis=locked) as stack:
        repo_uri = f"s3://{stack.bucket}"
        t = time.monotonic()
        tolerance = bert4rec.USERS_FP16_TOLERANCE if args.precision == "fp16" and args.size == "users" else None
        bundle = bert4rec.build_bundle(Path(tmp) / "bundle", factory, name, args.device, args.precision, tolerance)
        report["build_seconds"] = time.monotonic() - t
        compiled = model_folder.read(bundle / f"{name}_model")
        report["plain_model"] = plain_model_ms(
            compiled.version_dir / model_folder.MODEL_FILE, compiled.golden()[0], args.device, PLAIN_BATCHES
        )
        version = publish(bundle, repo_uri, "gpu-bench", s3=stack.s3).version
        staged = stage(repo_uri, name, version, stack.gate.http_url, s3=stack.s3, run_id="gpu-bench")
        report["stage"] = json.loads(staged.to_json())
        print(f"staged v{version}: accuracy {'passed' if staged.accuracy_passed else 'FAILED'}", flush=True)
        load = perf.LoadSettings(
            concurrency=args.tune_concurrency, window_ms=WINDOW_MS, stability_pct=RELAXED_STABILITY_PCT
        )
        tuning = tune(
            repo_uri,
            name,
            version,
            stack.gate.http_url,
            TuneSettings(load=load, max_p99_ms=args.tune_p99_ms, budget=args.tune_budget, instance_counts=(1, 2, 4)),
            s3=stack.s3,
            run_id="gpu-bench",
            metrics_url=stack.gate.metrics_url,
            enabled=args.tuned_from is None,
        )
        if args.tuned_from:
            earlier = TuneResult.from_json(json.dumps(json.loads(args.tuned_from.read_text())["tuning"]))
            tuning.chosen = earlier.chosen
            bench = GateBench(
                stack.gate.http_url, read_candidate(ModelRepository(repo_uri, stack.s3), name, version), load, 120
            )
            bench.apply(tuning.chosen)  # the gate measures the candidate as it would have been tuned
            bench.close()
        report["tuning"] = json.loads(tuning.to_json())
        source = f"from {args.tuned_from}" if args.tuned_from else tuning.confirmation or "the default"
        print(f"tuned: {tuning.chosen} ({source})", flush=True)
        gating = GateSettings(
            concurrency=args.tune_concurrency,
            window_ms=WINDOW_MS,
            thresholds=Thresholds(
                max_p99_ms=args.gate_p99_ms, max_p99_regression_pct=None, max_throughput_regression_pct=None
            ),
        )
        verdict = gate(
            repo_uri,
            name,
            version,
            stack.gate.http_url,
            gating,
            staged,
            s3=stack.s3,
            run_id="gpu-bench",
            tuning=tuning,
            metrics_url=stack.gate.metrics_url,
        )
        report["gate"] = {
            "verdict": verdict.verdict,
            "reasons": verdict.reasons,
            "rounds": verdict.rounds,
            "server": verdict.server,
        }
        print(f"gate: {verdict.verdict}: {'; '.join(verdict.reasons)}", flush=True)
        server = stack.replicas[0]
        if verdict.verdict == "pass":
            promote(
                repo_uri,
                name,
                version,
                [Replica(server.name, server.http_url)],
                "pass",
                stack.gate.http_url,
                tuning.chosen,
                s3=stack.s3,
                run_id="gpu-bench",
            )
            print("promoted to", server.name, flush=True)
        repo = ModelRepository(repo_uri, stack.s3)
        candidate = read_candidate(repo, name, version)
        if verdict.verdict != "pass":  # not promoted; installed by hand and measured all the same, to say why
            for member, config in candidate.production_configs().items():
                repo.copy_to_production(member, version)
                repo.write_desired_config(member, config, None)
        data = perf.write_input_data(candidate.golden_inputs, Path(tmp) / "input.json", batched=True)
        model_step = next(m for m in candidate.members if m.endswith("_model"))
        alone = read_candidate(repo, model_step, version)  # members are published at the ensemble's version
        targets = {
            "ensemble": (name, data),
            "model": (model_step, perf.write_input_data(alone.golden_inputs, Path(tmp) / "model.json", batched=True)),
        }
        forms = {
            form: eager_files(f"pipelines.samples.bert4rec:{factory}", args.precision, version)
            if form == "eager"
            else None
            for form in args.forms.split(",")
        }
        report["configs"] = []
        admin = TritonAdmin(server.http_url, load_timeout=300)
        for form, eager in forms.items():
            configs = [("users' default", USERS_DEFAULT)] if args.users else []
            configs.append(("tuned", tuning.chosen))
            for model_count, step_count, executor in args.instances:
                variant = dataclasses.replace(tuning.chosen, instance_count=model_count, step_instance_count=step_count)
                if executor is not None:
                    variant = dataclasses.replace(variant, optimized_execution=executor)
                executor_label = "" if executor is None else f", executor {'on' if executor else 'off'}"
                configs.append((f"tuned, {model_count}x{step_count}{executor_label}", variant))
            for label, settings in configs:
                print(f"  {form}, {label}: {settings}", flush=True)
                try:
                    load_ensemble(admin, repo, name, settings, eager)
                except TritonError as exc:  # recorded; the other configs are still measured
                    print(f"    not loaded: {exc}", flush=True)
                    report["configs"].append({"form": form, "config": label, "not_loaded": str(exc)})
                    continue
                for target in args.targets.split(","):
                    print(f"   {target}", flush=True)
                    served, served_data = targets[target]
                    points = sweep(server, served, served_data, args)
                    report["configs"].append(
                        {
                            "form": form,
                            "config": label,
                            "target": target,
                            "settings": settings.__dict__,
                            "points": points,
                            "best_within_p99": best_within(points, args.max_p99_ms),
                        }
                    )
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(report | {"seconds": time.monotonic() - started}, indent=2, default=str))
    print(
        f"\n{'form':<12} {'config':<15} {'target':<9} {'best infer/s with p99 <= ' + str(args.max_p99_ms) + ' ms':>34}"
    )
    for c in report["configs"]:
        best = c.get("best_within_p99")
        figure = "-" if best is None else f"{best['throughput']:,.0f} (p99 {best['p99_ms']:.2f} ms, {best['protocol']})"
        print(f"{c['form']:<12} {c['config']:<15} {c.get('target', '-'):<9} {figure:>34}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
