"""The users' BERT4Rec released on a GPU as the release pipeline runs it, then production measured (issue 62).

    python3 benchmarks/gpu_release.py --rate 50000 --out DIR   # the GPU machine: gpu_served_speed.sh release_start

Every step's settings come from the pipeline's parameters (components/release/step_settings.py PIPELINE_STEPS.settings: compile_target aoti,
precision fp16, compile_device cuda, the gate's request_rate `--rate` and max_p99_ms `--p99-ms`, the quality check's
eval_data and quality_spec; every other parameter at the pipeline's default), and each step is the function its
pipeline task calls, in the pipeline's order: export (the sample's `users_v1`, 50,000 items, length 200), compile
(with the CLI's `--int-mismatch 0.25`: fp16 swaps near-tied neighbours of random weights' top 10, bert4rec.py), publish,
stage (dark on the gate), quality, tune (at the gate's load, within its p99 limit: TuneSettings.within), gate and
promote, to two production replicas on the same GPU, neither pinned to CPUs: `summaries` (Triton's p99 latency
summary on, as the chart's production pods) and `nosummaries` (`latencySummaries: false`). The model's weights are
random, so the quality data's label is the fp32 eager model's first recommendation: the check is that the served
package still recommends it (hit rate@10 over a floor of 0.3).

Tune, the gate and production are loaded as components/serving/perf.py loads a fixed rate: over HTTP by several
synchronous perf_analyzer processes once one process's threads cannot carry it, over gRPC asynchronously.
Then production: each replica in turn, with perf_analyzer over each `--protocols` at each `--rates`
(benchmarks/served_points.py's sweep: throughput, p50, p99, GPU use, busy cores, Triton's queue and execution). With `--alone`, the model alone toward
`--alone-rates` on the replica without summaries: each serving variant (`I:D`: I instances, a queue delay of D µs;
`tuned`: as promoted) under each load (`PROTOCOL:CLIENTS`: that many perf_analyzer processes sharing the rate), with
`--http-threads N` also on one more server with Triton's `--http-thread-count=N`. The JSON is rewritten after every
phase, so a run stopped early keeps what it measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gpu_bert4rec import load_release
from benchmarks.served_points import best_within, cores_busy, gpu_sampler, step_breakdown, sweep
from components.model.compile import compile_model
from components.model.export import export
from components.model.model_config import ServingSettings
from components.model.settings import CompileSettings, ExportSettings
from components.release.gate.gate import gate
from components.release.promote.promote import promote
from components.release.publish import publish
from components.release.quality.quality import quality
from components.release.quality.spec import QualitySettings
from components.release.run_context import RunContext
from components.release.stage import read_candidate, stage
from components.release.step_settings import (
    PIPELINE_STEPS,
    ModelLoadSettings,
    PromoteSettings,
    PublishSettings,
    TuneSettings,
)
from components.release.tune.tune import tune
from components.repository import ModelRepository
from components.repository.store import PRODUCTION
from components.serving import admin_key, perf
from components.serving.triton_admin import TritonAdmin
from components.settings import RELAXED_STABILITY_PCT, GateSettings
from pipelines.samples import bert4rec
from pipelines.stack import LATENCY_SUMMARIES, EmbeddedStack

HERE = Path(__file__).parent
RUN_ID = "gpu-release"
FACTORIES = {"users": "users_v1", "demo": "bert4rec_v1"}
QUALITY_SPEC = {
    "metrics": [
        {"metric": "hit_rate", "k": 10, "output": "topk_indices", "label": "next_item", "floor": 0.3, "max_drop_pct": 2}
    ]
}
CLIENT_THREADS = 256  # perf_analyzer's --max-threads per process at a fixed rate
LOCKED = [a for a in admin_key.RESTRICTED_APIS if a != "model-config"]  # perf_analyzer over gRPC reads the config


def eval_data(path: Path, size: bert4rec.Size, factory: str, rows: int, device: str) -> Path:
    """Histories through the pre step's lookup, labelled with the fp32 eager model's first recommendation."""
    item_ids, mask_pos = bert4rec.CataloguePre(size)(torch.from_numpy(bert4rec.histories(rows, seed=62, size=size)))
    model = getattr(bert4rec, factory)().to(device)
    with torch.no_grad():
        labels = [
            model(item_ids[s : s + 256].to(device), mask_pos[s : s + 256].to(device))[0][:, 0].cpu()
            for s in range(0, rows, 256)
        ]
    np.savez(path, item_ids=item_ids.numpy(), mask_pos=mask_pos.numpy(), next_item=torch.cat(labels).numpy())
    return path


def variant(text: str) -> tuple[int, int] | None:
    if text == "tuned":
        return None
    count, _, delay = text.partition(":")
    return int(count), int(delay or 0)


def clients_point(server, name: str, data: Path, protocol: str, clients: int, rate: float) -> dict:
    """`clients` perf_analyzer processes at once, each at rate / clients: the sum of their throughput, the p99 of
    all their requests, the GPU's use, the cores each party kept busy and Triton's queue and execution."""
    load = perf.LoadSettings(
        request_rate=rate / clients,
        window_ms=1000,
        stability_pct=RELAXED_STABILITY_PCT,
        protocol=protocol,
        clients=1,
        async_requests=protocol == "grpc",
    )
    load = dataclasses.replace(load, max_threads=None if perf.asynchronous(load) else CLIENT_THREADS)
    url = server.grpc_url if protocol == "grpc" else server.http_url
    with TritonAdmin(server.http_url) as admin:
        before = admin.statistics()
        with gpu_sampler(server.metrics_url) as gpu, cores_busy(server.process.pid) as cores:
            runs = perf.measure_together(url, [perf.Target(name)] * clients, data, load, timeout=60)
        after = admin.statistics()
    done = [r for r in runs if r.ok]
    latencies = np.concatenate([r.latencies_us for r in done]) if done else np.empty(0)
    return {
        "protocol": protocol,
        "clients": clients,
        "request_rate": rate,
        "ok": len(done) == clients,
        "reasons": [r.reason for r in runs if not r.ok],
        "asynchronous": perf.asynchronous(load),
        "throughput": round(sum(r.points[0].throughput for r in done), 1),
        "p50_ms": float(np.percentile(latencies, 50)) / 1000 if latencies.size else None,
        "p99_ms": float(np.percentile(latencies, 99)) / 1000 if latencies.size else None,
        "gpu": gpu,
        "cores_busy": cores,
        "steps": step_breakdown(before, after),
    }


def threaded_server(stack: EmbeddedStack, threads: int):
    """One more production server, unpinned and without latency summaries, with Triton's --http-thread-count."""
    from pipelines.processes import free_port

    ports = [free_port(), free_port(), free_port()]
    args = [
        f"--model-repository={stack.s3.triton_uri(stack.bucket, PRODUCTION)}",
        "--model-control-mode=explicit",
        "--strict-model-config=false",
        f"--http-port={ports[0]}",
        f"--grpc-port={ports[1]}",
        f"--metrics-port={ports[2]}",
        "--http-address=127.0.0.1",
        "--grpc-address=127.0.0.1",
        "--allow-gpu-metrics=true",
        f"--http-thread-count={threads}",
        "--exit-timeout-secs=5",
        *admin_key.triton_args(stack.admin_key, LOCKED),
    ]
    return stack.launch_triton(f"threads-{threads}", args)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--size", default="users", choices=FACTORIES)
    parser.add_argument("--precision", default="fp16", choices=("fp32", "fp16", "bf16"))
    parser.add_argument("--rate", type=float, default=50_000, help="the gate's request_rate (tune's load)")
    parser.add_argument("--p99-ms", type=float, default=4.0, help="the gate's max_p99_ms (tune's limit)")
    parser.add_argument("--rates", type=float, nargs="+", default=[20_000, 50_000, 60_000], help="production's load")
    parser.add_argument("--protocols", nargs="+", default=["http"], help="production's clients (grpc: asynchronous)")
    parser.add_argument("--eval-rows", type=int, default=2000)
    parser.add_argument("--parameters", default="{}", help="more pipeline parameters, JSON (e.g. tune_budget)")
    parser.add_argument("--alone", nargs="*", default=[], help="serving variants, I:D or tuned, e.g. tuned 4:300")
    parser.add_argument("--alone-loads", nargs="+", default=["http:1", "grpc:1", "grpc:4"], help="PROTOCOL:CLIENTS")
    parser.add_argument("--alone-rates", type=float, nargs="+", default=[100_000])
    parser.add_argument("--http-threads", type=int, default=0, help="also on a server with --http-thread-count=N")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    device = args.device.split(":")[0]
    factory = FACTORIES[args.size]
    size = bert4rec.USERS if args.size == "users" else bert4rec.DEMO
    out = args.out / f"gpu_release_{device}_{args.size}_{args.precision}_aoti_{args.rate:.0f}.json"
    report: dict = {
        "command": " ".join(sys.argv),
        "torch": torch.__version__,
        "machine": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "seconds": {},
    }
    started = time.monotonic()

    def save() -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report | {"total_seconds": round(time.monotonic() - started)}, indent=2, default=str))

    def phase(label: str, t: float) -> None:
        report["seconds"][label] = round(time.monotonic() - t, 1)
        print(f"== {label}: {report['seconds'][label]} s", flush=True)
        save()

    with tempfile.TemporaryDirectory() as tmp, EmbeddedStack(replicas=0, gate=True, locked_apis=LOCKED) as stack:
        work, repo_uri = Path(tmp), f"s3://{stack.bucket}"
        repo = ModelRepository(repo_uri, stack.s3)
        # Both replicas unpinned, as a pod with a GPU gets cores of its own: the stack's prod-N replicas run on
        # one CPU each (a 2-core machine's setting), which held the chart's replica near 20,000/s in the last run.
        summaries = stack.add_triton("summaries", [PRODUCTION], LATENCY_SUMMARIES)
        plain = stack.add_triton("nosummaries", [PRODUCTION], ())
        replicas = {"summaries (the chart's p99 summary)": summaries, "nosummaries": plain}
        parameters = {
            "compile_target": "aoti",
            "precision": args.precision,
            "compile_device": args.device,
            "request_rate": args.rate,
            "max_p99_ms": args.p99_ms,
            "serving_torch": stack.serving_torch,
            "eval_data": str(work / "eval.npz"),
            "quality_spec": json.dumps(QUALITY_SPEC),
            **json.loads(args.parameters),
        }
        steps = PIPELINE_STEPS.settings(parameters)
        report["pipeline_parameters"], report["step_settings"] = parameters, steps
        name = f"b4r_{args.size}_aoti"
        t = time.monotonic()
        (work / "signature.json").write_text(json.dumps(size.signatures()["model"]))
        chosen_export = ExportSettings.from_dict(steps["export"])
        export(f"pipelines.samples.bert4rec:{factory}", work / "signature.json", work / "export", chosen_export)
        phase("export", t)
        t = time.monotonic()
        compiled = CompileSettings.from_dict({**steps["compile"], "int_mismatch": 0.25})
        result = compile_model(work / "export", work / name, name, compiled)
        report["compile"] = {"seconds": result.seconds, "parity": [dataclasses.asdict(r) for r in result.parity]}
        phase("compile", t)
        t = time.monotonic()
        eval_data(work / "eval.npz", size, factory, args.eval_rows, args.device)
        phase("quality data", t)
        t = time.monotonic()
        publishing = RunContext(repo_uri, "", s3=stack.s3, run_id=RUN_ID)  # the folder's model
        version = publish(publishing, PublishSettings.from_dict(steps["publish"]), folder=work / name).version
        phase("publish", t)
        t = time.monotonic()
        context = RunContext(repo_uri, name, version, stack.gate.replica, stack.s3, RUN_ID)
        loading = ModelLoadSettings.from_dict(steps["load"])  # stage's and promote's
        staged = stage(context, loading)
        report["stage"] = json.loads(staged.to_json())
        phase("stage", t)
        t = time.monotonic()
        checked = QualitySettings.from_dict(steps["quality"])
        judged = quality(context, checked)
        report["quality"] = {"decision": judged.decision, "reasons": judged.reasons, "metrics": judged.metrics}
        phase("quality", t)
        t = time.monotonic()
        tuning_settings = TuneSettings.from_dict(steps["tune"])
        tuning_settings = dataclasses.replace(
            tuning_settings, enabled=tuning_settings.enabled and staged.accuracy_passed
        )
        tuning = tune(context, tuning_settings)
        report["tuning"] = json.loads(tuning.to_json())
        print(f"tuned: {tuning.chosen} ({tuning.confirmation or 'the default'})", flush=True)
        for trial in tuning.trials:
            print(f"  {trial.row()}", flush=True)
        phase("tune", t)
        t = time.monotonic()
        gating = GateSettings.from_dict(steps["gate"])
        verdict = gate(context, gating, staged, work / "gate", tuning=tuning, quality=judged)
        report["gate"] = {
            "verdict": verdict.verdict,
            "reasons": verdict.reasons,
            "rounds": verdict.rounds,
            "candidate": verdict.candidate.summary(),
            "server": verdict.server,
            "stopped": verdict.stopped,
            "measurement_seconds": round(verdict.measurement_seconds, 1),
            "attempts": [
                {"round": a.round, "ok": a.ok, "seconds": a.seconds, "requests": a.requests, "reason": a.reason}
                for a in verdict.attempts
            ],
        }
        print(f"gate: {verdict.verdict}: {'; '.join(verdict.reasons)}", flush=True)
        phase("gate", t)
        t = time.monotonic()
        try:
            promoted = promote(
                RunContext(repo_uri, name, version, stack.gate.replica, stack.s3, RUN_ID),
                PromoteSettings.from_dict(steps["promote"]),  # as settings_op hands it to the promote task
                replicas=[s.replica for s in replicas.values()],
                verdict=verdict.verdict,
                quality=verdict.quality.decision if verdict.quality else None,
                serving=tuning.chosen,
            )
            report["promote"] = json.loads(promoted.to_json())
        except Exception as exc:  # measured all the same, installed by hand, to say why
            report["promote"] = {"promoted": False, "error": f"{type(exc).__name__}: {exc}"}
            print(f"not promoted: {exc}; installed by hand with the tuned settings", flush=True)
            candidate = read_candidate(repo, name, version)
            for member, config in candidate.production_configs().items():
                repo.copy_to_production(member, version)
                repo.write_desired_config(member, config, None)
            for server in replicas.values():
                with TritonAdmin(server.http_url, load_timeout=300) as admin:
                    load_release(admin, repo, name, tuning.chosen)
        phase("promote", t)
        candidate = read_candidate(repo, name, version)
        data = perf.write_input_data(candidate.golden_inputs, work / "input.json", batched=True)
        report["production"] = {}
        for label, server in replicas.items():
            t = time.monotonic()
            points = sweep(server, name, data, args.protocols, args.rates, [1])
            report["production"][label] = {"points": points, "best_within_p99": best_within(points, args.p99_ms)}
            phase(f"production {label}", t)
        alone(args, stack, repo, name, plain, data, tuning.chosen, report, phase)
    summary(report, args.p99_ms)
    print(f"wrote {out}")


def alone(args, stack, repo, name, plain, data, chosen: ServingSettings, report: dict, phase) -> None:
    """The model alone toward `--alone-rates`: each serving variant under each client load (module docstring)."""
    if not args.alone:
        return
    servers = {"no summaries": plain}
    if args.http_threads:
        try:
            servers[f"http threads {args.http_threads}"] = threaded_server(stack, args.http_threads)
        except Exception as exc:
            report["threaded_server_error"] = str(exc)
    report["alone"] = []
    for label, server in servers.items():
        with TritonAdmin(server.http_url, load_timeout=300) as admin:
            for text in args.alone:
                t = time.monotonic()
                shape = variant(text)
                settings = chosen
                if shape is not None:
                    settings = dataclasses.replace(chosen, instance_count=shape[0], max_queue_delay_us=shape[1])
                try:
                    load_release(admin, repo, name, settings)
                    warm = perf.LoadSettings(
                        request_rate=max(args.alone_rates),
                        max_threads=CLIENT_THREADS,
                        stability_pct=RELAXED_STABILITY_PCT,
                    )
                    perf.measure(server.http_url, name, data, warm, timeout=60)  # first batches, unrecorded
                except Exception:
                    report["alone"].append({"server": label, "variant": text, "error": traceback.format_exc()[-600:]})
                    continue
                for load in args.alone_loads:
                    protocol, _, clients = load.partition(":")
                    for rate in args.alone_rates:
                        point = clients_point(server, name, data, protocol, int(clients or 1), rate)
                        point |= {"server": label, "variant": text, "settings": dataclasses.asdict(settings)}
                        report["alone"].append(point)
                        print(
                            f"  alone {label:<16} {text:<7} {protocol}x{clients} {rate:>8,.0f}/s: "
                            f"{point['throughput']:>9,.0f}/s p50 {point['p50_ms'] or 0:5.2f} p99 {point['p99_ms'] or 0:6.2f}"
                            f" ms cores {point['cores_busy']} gpu {point['gpu'].get('gpu_util_pct_mean')}"
                            f" steps {point['steps'].get(name)} {point['reasons']}",
                            flush=True,
                        )
                phase(f"alone {label} {text}", t)


def summary(report: dict, p99_ms: float) -> None:
    tuning = report.get("tuning", {})
    print(
        f"\ntune chose {tuning.get('chosen')} ({tuning.get('confirmation')}); gate {report.get('gate', {}).get('verdict')}"
    )
    print(f"promoted: {report.get('promote', {}).get('promoted')}; seconds per phase {report['seconds']}")
    for label, entry in report.get("production", {}).items():
        for p in entry["points"]:
            at = f"{p['request_rate']:,.0f}/s" if p["request_rate"] else f"conc {p['concurrency']}"
            print(
                f"{label:<22} {at:>10}: {p['throughput'] or 0:>9,.0f}/s p50 {p['p50_ms'] or 0:.2f} p99 {p['p99_ms'] or 0:.2f} ms"
            )
    for p in report.get("alone", []):
        if "error" not in p:
            print(
                f"alone {p['server']:<16} {p['variant']:<7} {p['protocol']}x{p['clients']} {p['request_rate']:>8,.0f}/s: "
                f"{p['throughput']:>9,.0f}/s p99 {p['p99_ms'] or 0:.2f} ms"
                + (" (within)" if p["p99_ms"] and p["p99_ms"] <= p99_ms else "")
            )


if __name__ == "__main__":
    main()
