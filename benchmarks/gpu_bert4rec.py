"""The users' BERT4Rec ensemble on a GPU: released through the real steps, then served as the users had it
(the default) against the config `tritonship tune` chose.

    python3 benchmarks/gpu_bert4rec.py --precision fp16             # on the GPU machine (gpu_served_speed.sh)
    .venv/bin/python benchmarks/gpu_bert4rec.py --device cpu --size demo --rates 100 --concurrency 1 4   # smoke

The release: build the ensemble bundle (catalogue ids -> bert4rec_pre -> BERT4Rec -> bert4rec_post; the
model at the users' size, 50,000 items, hidden 256, 2 layers, 4 heads, sequence length 200, top-10, with
random weights; exported with the default method and compiled to TorchScript on `--device` at
`--precision`), publish it to the embedded S3, stage it dark on the gate (accuracy against the eager
reference), tune it (one setting for every member, the pre/post steps with an instance count of their own, at
concurrency `--tune-concurrency`, or at the fixed request rate `--tune-rate`), gate it (a first
release: the absolute limit p99 <= `--gate-p99-ms` at that load) and promote it to the production replica.

Then, on that replica, for each serving config (the users': max_batch_size 1, one instance, no dynamic
batching; and the tuned one) and each served form of the model step that `--forms` names (`torchscript`,
the compiled model; `eager`, the eager nn.Module loaded through Triton's load API with its files): a warm-up
run that is not recorded (the first requests after a load pay for CUDA's and TorchScript's start), then a
request-rate sweep and a concurrency sweep with perf_analyzer over each protocol `--protocols` names (`http`; `grpc`: perf_analyzer
2.51 sends its `-H` header over HTTP only, so with gRPC the stack leaves the model-config API open, which
perf_analyzer reads; load and unload stay locked). Per point (benchmarks/served_points.py): throughput,
p50 and p99, the GPU's utilisation and memory (Triton's metrics endpoint; NVML when Triton reports none)
and, per ensemble step, its mean queue and batch size and what one execution costs inside the backend
(input, infer, output; Triton's statistics API): where the time goes. Beside them, the compiled model.pt
alone in this process at batch 1 to 256 (no server): the reference for the model step's infer.
`--instances 1x4 2x4:off` also serves the tuned settings with other instance counts (model x each step),
and with the TorchScript profiling executor on or off; `--no-users` leaves the users' config out.
`--client-cpus 0 4` measures each sweep twice: perf_analyzer on every core beside the server (one host, as
the users measured), then on 4 cores of its own with the server on the rest (as a client on another host);
each point records the cores perf_analyzer, tritonserver and the Python steps' stubs kept busy.
`--steps torchscript` releases the ensemble with its pre/post steps compiled to TorchScript (the PyTorch backend
serves them; no Python process between the steps), `--model-target aoti` its model step as an AOTInductor
package. `--release folded` releases the recommender with its pre/post lookups folded into the model
(`bert4rec.WithCatalogue`: catalogue ids in and out, one TorchScript, no Python step) through the same steps.
Writes benchmarks/results/gpu_bert4rec_<device>_<precision>[_folded|_compiled_steps][_aoti][_<forms>][_<protocols>][_client<N_…>][_instances]_pytorch_backend.json
(the files without `_pytorch_backend` were measured with the model step in the Python backend).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.served_points import WINDOW_MS, best_within, plain_model_ms, sweep
from components.model import ensemble, model_folder
from components.model.model_config import ServingSettings, with_settings
from components.model.settings import CompileSettings
from components.release.gate.gate import gate
from components.release.promote.promote import promote
from components.release.promote.settings import PromoteSettings
from components.release.publish import PublishSettings, publish
from components.release.results import TuneResult
from components.release.run_context import RunContext
from components.release.stage import read_candidate, stage
from components.release.tune.tune import GateBench, TuneSettings, tune
from components.repository import ModelRepository
from components.serving import admin_key, perf
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin, TritonError
from components.settings import RELAXED_STABILITY_PCT, GateSettings, Thresholds
from pipelines.samples import bert4rec
from pipelines.samples.bert4rec import build as bert4rec_build
from pipelines.stack import EmbeddedStack

HERE = Path(__file__).parent
USERS_DEFAULT = ServingSettings(max_batch_size=1, dynamic_batching=False, instance_count=1)  # as the users had it
USERS_RATES = [1500, 2000, 2500, 3000]  # the users' own load: perf_analyzer --request-rate-range 1500:3000:500
PLAIN_BATCHES = [1, 8, 32, 128, 256]
FACTORIES = {  # (size, release): the sample's factory
    ("users", "ensemble"): "users_v1",
    ("demo", "ensemble"): "bert4rec_v1",
    ("users", "folded"): "users_folded_v1",
    ("demo", "folded"): "folded_v1",
}


def load_release(
    admin: TritonAdmin, repo: ModelRepository, name: str, settings: ServingSettings | None, eager: dict | None = None
) -> None:
    """(Re)load the promoted release on a replica with `settings` (None: as promoted): an ensemble's every
    member, the model step as the eager module when `eager` gives its files; a single model as it is."""
    config, _ = repo.desired_config(name)
    if not ensemble.is_ensemble(config):
        admin.load(name, config if settings is None else with_settings(config, settings))
        admin.wait_ready(name)
        return
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
        "--tune-rate",
        type=float,
        default=None,
        help="tune at this fixed request rate instead (the lowest p99 that keeps up wins), e.g. 10000",
    )
    parser.add_argument(
        "--tune-p99-ms", type=float, default=None, help="tune's p99 limit; default: the default setting's p99 + slack"
    )
    parser.add_argument("--tune-budget", type=int, default=14)
    parser.add_argument(
        "--release",
        default="ensemble",
        choices=("ensemble", "folded"),
        help="what is released: the users' ensemble, or the model with its steps folded in (one model)",
    )
    parser.add_argument(
        "--steps",
        default="python",
        choices=("python", "torchscript"),
        help="the ensemble's pre/post steps: Python backend, or compiled to TorchScript (PyTorch backend)",
    )
    parser.add_argument("--model-target", default="torchscript", choices=("torchscript", "aoti"), help="the model step")
    parser.add_argument(
        "--targets",
        default=None,
        help="what perf_analyzer drives: the ensemble, and the model step alone (its own inputs); default "
        "ensemble,model (a folded release has only its model)",
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
        "--client-cpus",
        type=int,
        nargs="+",
        default=[0],
        metavar="N",
        help="where perf_analyzer runs, each in turn: 0 on every core beside the server (one host), N on the "
        "last N cores alone with the server on the rest (as a client on another host would)",
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
    folded = args.release == "folded"
    if folded and args.forms != "torchscript":
        parser.error("a folded release is served as TorchScript only")
    factory = FACTORIES[args.size, args.release]
    name = f"b4r{'f' if folded else ''}_{args.precision}"
    args.targets = args.targets or ("model" if folded else "ensemble,model")
    report: dict = {
        "arguments": vars(args),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
        "machine": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
    }
    forms = "" if args.forms == "torchscript" else "_" + args.forms.replace(",", "_")
    protocols = "" if args.protocols == "http" else "_" + args.protocols.replace(",", "_")
    placed = "_client" + "_".join(map(str, args.client_cpus)) if args.client_cpus != [0] else ""
    suffix = (
        ("_folded" if folded else "_compiled_steps" if args.steps == "torchscript" else "")
        + ("_aoti" if args.model_target == "aoti" else "")
        + forms
        + protocols
        + placed
        + ("_instances" if args.instances else "")
    )
    out = HERE / "results" / f"gpu_bert4rec_{args.device.split(':')[0]}_{args.precision}{suffix}_pytorch_backend.json"
    grpc = "grpc" in args.protocols.split(",")
    locked = [api for api in admin_key.RESTRICTED_APIS if not (grpc and api == "model-config")]
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedStack(replicas=1, gate=True, locked_apis=locked) as stack:
        repo_uri = f"s3://{stack.bucket}"
        t = time.monotonic()
        users_fp16 = args.precision == "fp16" and args.size == "users"
        int_mismatch = bert4rec.USERS_FP16_TOLERANCE.int_mismatch if users_fp16 else None
        chosen = CompileSettings(precision=args.precision, device=args.device, int_mismatch=int_mismatch)
        if folded:
            bundle = bert4rec_build.build_folded(Path(tmp) / name, factory, chosen)
        else:
            compiled_steps = args.steps == "torchscript"
            model = dataclasses.replace(chosen, target=args.model_target)
            bundle = bert4rec_build.build_bundle(Path(tmp) / "bundle", factory, name, model, compiled_steps)
        report["build_seconds"] = time.monotonic() - t
        compiled = model_folder.read(bundle if folded else bundle / f"{name}_model")
        plain = compiled.version_dir / model_folder.MODEL_FILE  # a package has none (benchmarks/gpu_aoti.py times it)
        golden = compiled.golden()[0]
        report["plain_model"] = plain_model_ms(plain, golden, args.device, PLAIN_BATCHES) if plain.exists() else None
        publishing = RunContext(repo_uri, "", s3=stack.s3, run_id="gpu-bench")  # the bundle's model
        version = publish(publishing, PublishSettings(serving_torch=stack.serving_torch), folder=bundle).version
        context = RunContext(repo_uri, name, version, stack.gate.replica, stack.s3, "gpu-bench")
        staged = stage(context)
        report["stage"] = json.loads(staged.to_json())
        print(f"staged v{version}: accuracy {'passed' if staged.accuracy_passed else 'FAILED'}", flush=True)
        load = perf.LoadSettings(
            concurrency=args.tune_concurrency,
            request_rate=args.tune_rate,
            window_ms=WINDOW_MS,
            stability_pct=RELAXED_STABILITY_PCT,
        )
        searched = TuneSettings(
            load=load,
            max_p99_ms=args.tune_p99_ms,
            budget=args.tune_budget,
            instance_counts=(1, 2, 4),
            enabled=args.tuned_from is None,
        )
        tuning = tune(context, searched)
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
            load=dataclasses.replace(GateSettings().load, concurrency=args.tune_concurrency, window_ms=WINDOW_MS),
            thresholds=Thresholds(
                max_p99_ms=args.gate_p99_ms, max_p99_regression_pct=None, max_throughput_regression_pct=None
            ),
        )
        context = RunContext(repo_uri, name, version, stack.gate.replica, stack.s3, "gpu-bench")
        verdict = gate(context, gating, staged, tuning=tuning)  # with the gate's metrics: its GPU/CPU figures
        report["gate"] = {
            "verdict": verdict.verdict,
            "reasons": verdict.reasons,
            "rounds": verdict.rounds,
            "server": verdict.server,
        }
        print(f"gate: {verdict.verdict}: {'; '.join(verdict.reasons)}", flush=True)
        server = stack.replicas[0]
        if verdict.verdict == "pass":
            context = RunContext(repo_uri, name, version, stack.gate.replica, stack.s3, "gpu-bench")
            no_canary = PromoteSettings.from_flat(canary=False)  # one replica: none would stay to compare with
            targets = [Replica(server.name, server.http_url)]
            promote(context, no_canary, replicas=targets, verdict="pass", serving=tuning.chosen)
            print("promoted to", server.name, flush=True)
        repo = ModelRepository(repo_uri, stack.s3)
        candidate = read_candidate(repo, name, version)
        if verdict.verdict != "pass":  # not promoted; installed by hand and measured all the same, to say why
            for member, config in candidate.production_configs().items():
                repo.copy_to_production(member, version)
                repo.write_desired_config(member, config, None)
        data = perf.write_input_data(candidate.golden_inputs, Path(tmp) / "input.json", batched=True)
        if folded:
            targets = {"model": (name, data)}
        else:
            model_step = next(m for m in candidate.members if m.endswith("_model"))
            alone = read_candidate(repo, model_step, version)  # members are published at the ensemble's version
            model_data = perf.write_input_data(alone.golden_inputs, Path(tmp) / "model.json", batched=True)
            targets = {"ensemble": (name, data), "model": (model_step, model_data)}
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
                    load_release(admin, repo, name, settings, eager)
                except TritonError as exc:  # recorded; the other configs are still measured
                    print(f"    not loaded: {exc}", flush=True)
                    report["configs"].append({"form": form, "config": label, "not_loaded": str(exc)})
                    continue
                for target, client_cores in [(t, c) for t in args.targets.split(",") for c in args.client_cpus]:
                    print(f"   {target}, client on {client_cores or 'every'} core(s)", flush=True)
                    served, served_data = targets[target]
                    protocols = args.protocols.split(",")
                    points = sweep(server, served, served_data, protocols, args.rates, args.concurrency, client_cores)
                    report["configs"].append(
                        {
                            "form": form,
                            "config": label,
                            "target": target,
                            "client_cores": client_cores,
                            "settings": settings.__dict__,
                            "points": points,
                            "best_within_p99": best_within(points, args.max_p99_ms),
                        }
                    )
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_text(json.dumps(report | {"seconds": time.monotonic() - started}, indent=2, default=str))
    print(
        f"\n{'form':<12} {'config':<15} {'target':<9} {'client cores':<12} "
        f"{'best infer/s with p99 <= ' + str(args.max_p99_ms) + ' ms':>34}"
    )
    for c in report["configs"]:
        best = c.get("best_within_p99")
        figure = "-" if best is None else f"{best['throughput']:,.0f} (p99 {best['p99_ms']:.2f} ms, {best['protocol']})"
        cores = str(c.get("client_cores") or "shared")
        print(f"{c['form']:<12} {c['config']:<15} {c.get('target', '-'):<9} {cores:<12} {figure:>34}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
