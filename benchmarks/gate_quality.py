"""How good are the gate's decisions? A/A trials and injected latency regressions on the embedded stack.

    .venv/bin/python benchmarks/gate_quality.py [--designs duet,alternating] [--injections 0:40,10:20,25:20]

Stable and every candidate are the same traced MLP served by Triton's PyTorch backend; candidates carry
busy work inside the TorchScript (tests/latency_injection.py) that takes a fixed time per sample in the gate
server, sized as +0% (A/A), +10%, +25% ... of the stable's measured p99 latency ("+25% p99 injected"; `--size-by median` sizes it on the median, as earlier runs
did; `--base-us N` on a fixed N us, since one start-up reading of a p99 can be far off). While every
decision runs, a client sends steady traffic (100 requests/s each) to both production replicas, as the
release tests do. Each trial is one full gate decision with the gate's defaults (load
the stable version, warm up, rounds until the limits decide or the budget is spent); `--limit-pct P`
sets both relative limits to P% instead. With `--busy N`, N more processes keep a CPU each busy
meanwhile (a busy machine). Reports per design and injection the verdicts, the false-fail and
inconclusive rates on A/A, the detection rate (verdict fail), the observed p99 and throughput changes
and the seconds per decision.
With `--gpu` (the lent GPU machine) the stable is the users' BERT4Rec (50,000 items, sequence length 200)
compiled to fp16 TorchScript and served on the GPU, and each candidate is it with the busy work wrapped
around it (its loop is timed on the CPU; on the GPU the observed p99 change is the figure to read).
Prints a table and writes benchmarks/results/gate_quality.json.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.model import model_config
from components.release.gate.calibration import budgets, calibrate
from components.release.gate.gate import gate
from components.release.publish import publish
from components.release.run_context import RunContext
from components.release.stage import stage, unload_candidate
from components.repository import ModelRepository
from components.serving import perf
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin
from components.settings import GateSettings
from pipelines.live_traffic import LiveTraffic
from pipelines.stack import PRODUCTION_PREFIX, EmbeddedStack
from tests import latency_injection
from tests.models import mlp_folder, upload_folder

MODEL = "gq"


def gpu_model(tmp_path: Path) -> Path:
    """The users' BERT4Rec (pipelines/samples/bert4rec, USERS size) compiled to fp16 TorchScript on the GPU,
    served by Triton's PyTorch backend on a KIND_GPU instance."""
    from components.model.compile import compile_model
    from components.model.export import export
    from components.model.settings import CompileSettings
    from pipelines.samples import bert4rec

    (tmp_path / "sig.json").write_text(json.dumps(bert4rec.USERS.signatures()["model"]))
    export("pipelines.samples.bert4rec:users_v1", tmp_path / "sig.json", tmp_path / "export")
    compiled = tmp_path / "gpu" / MODEL
    fp16 = CompileSettings(precision="fp16", device="cuda", int_mismatch=bert4rec.USERS_FP16_TOLERANCE.int_mismatch)
    compile_model(tmp_path / "export", compiled, MODEL, fp16)
    return compiled


def demo_model(tmp_path: Path) -> Path:
    """The demo's trained BERT4Rec (v2's architecture and seed-1 weights, as `tritonship demo` trains it), compiled to
    fp32 TorchScript for Triton's PyTorch backend on the CPU."""
    from pipelines.samples import bert4rec
    from pipelines.samples.bert4rec import training
    from pipelines.samples.bert4rec.build import compiled_folder

    training.save_checkpoint(training.train(1), tmp_path / "seed1.pt")
    (tmp_path / "demo").mkdir()
    return compiled_folder(
        "demo_v2", bert4rec.DYNAMIC_SIGNATURE, tmp_path / "demo" / MODEL, checkpoint=tmp_path / "seed1.pt"
    )


def model_folder(
    tmp_path: Path,
    label: str,
    delay_us: float,
    base: Path | None,
    per_iteration_us: float | None = None,
    name: str = MODEL,
) -> Path:
    """The stable (delay 0) or a candidate: the MLP, or with `base` that compiled model (the GPU or the demo one)."""
    (tmp_path / label).mkdir()
    if base is None:
        return mlp_folder(tmp_path / label, name, delay_us=delay_us, per_iteration_us=per_iteration_us)
    folder = shutil.copytree(base, tmp_path / label / name)
    if name != MODEL:  # the probe: its config names it as its folder does, or Triton cannot poll it
        config = model_config.parse_pbtxt((folder / "config.pbtxt").read_text())
        (folder / "config.pbtxt").write_text(model_config.to_pbtxt(model_config.renamed(config, name)))
    if delay_us:
        import torch

        device = "cuda" if "KIND_GPU" in (folder / "config.pbtxt").read_text() else "cpu"
        compiled = torch.jit.load(str(folder / "1" / "model.pt"), map_location=device)
        latency_injection.with_busy_work(compiled, delay_us, per_iteration_us).save(str(folder / "1" / "model.pt"))
    return folder


def stable_latency_us(stack: EmbeddedStack, folder: Path, name: str = MODEL) -> dict[str, float]:
    """The stable's median and p99 latency at the gate's load, each the median over three runs."""
    golden = dict(np.load(folder / "1" / "golden.npz"))
    data = perf.write_input_data({k[3:]: v for k, v in golden.items() if k.startswith("in:")}, folder / "in.json", True)
    runs = [r for r in (perf.measure(stack.gate.http_url, name, data, GateSettings().load) for _ in range(3)) if r.ok]
    return {
        "median": statistics.median(float(np.median(r.latencies_us)) for r in runs),
        "p99": statistics.median(float(np.percentile(r.latencies_us, 99)) for r in runs),
    }


PROBE_US = 1000  # the probe's busy work, sized in this process


def served_iteration_us(stack: EmbeddedStack, tmp_path: Path, gpu_base: Path | None, stable: str = MODEL) -> float:
    """What one busy-work iteration costs in the gate server at the gate's load (loaded beside the stable, as a
    candidate is): a probe with PROBE_US of work sized here, measured in turns with the stable 3 times; the
    difference of their median latencies over its iterations. A server's loop runs slower than this
    process's idle one, and a candidate must add what its injection says, not what an idle core would take."""
    probe_name = f"{stable}_probe"
    probe = model_folder(tmp_path, "probe", PROBE_US, gpu_base, name=probe_name)
    upload_folder(stack.s3.client(), stack.bucket, probe, f"{PRODUCTION_PREFIX}/{probe_name}")
    golden = dict(np.load(probe / "1" / "golden.npz"))
    data = perf.write_input_data({k[3:]: v for k, v in golden.items() if k.startswith("in:")}, probe / "in.json", True)
    medians: dict[str, list[float]] = {stable: [], probe_name: []}
    with TritonAdmin(stack.gate.http_url) as admin:
        admin.load(probe_name)
        for _ in range(3):
            for name, runs in medians.items():
                result = perf.measure(stack.gate.http_url, name, data, GateSettings().load)
                if result.ok:
                    runs.append(float(np.median(result.latencies_us)))
        admin.unload(probe_name)
    added_us = statistics.median(medians[probe_name]) - statistics.median(medians[stable])
    return added_us / round(PROBE_US / latency_injection.iteration_us())


def round_log_ratios(result) -> list[float]:
    """Each round's log(candidate p99 / stable p99): its spread over A/A rounds is the design's noise."""
    pairs = zip(result.candidate.per_round(), result.stable.per_round(), strict=False)
    return [float(np.log(c.p99_ms / s.p99_ms)) for c, s in pairs if c.p99_ms and s.p99_ms]


@contextlib.contextmanager
def busy_cpus(count: int) -> Iterator[None]:
    """`count` processes that spin at normal priority, each keeping a CPU busy, while the block runs."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--designs", default="duet,alternating")
    parser.add_argument("--injections", default="0:40,10:20,25:20", help="percent:trials,... (per design)")
    parser.add_argument("--alternating-injections", default="0:10,25:5", help="the same for the alternating design")
    parser.add_argument(
        "--size-by", choices=("p99", "median"), default="p99", help="the stable latency an injection is a percent of"
    )
    parser.add_argument(
        "--base-us", type=float, help="size injections on this latency (us) instead of one measured at start-up"
    )
    parser.add_argument("--limit-pct", type=float, help="both relative limits (p99 growth, throughput loss), percent")
    parser.add_argument("--gpu", action="store_true", help="gate the users' BERT4Rec, fp16 on the GPU")
    parser.add_argument("--busy", type=int, default=0, help="processes that keep a CPU busy during every decision")
    parser.add_argument("--demo-model", action="store_true", help="gate the demo's trained BERT4Rec (CPU TorchScript)")
    parser.add_argument(
        "--calibrate", type=int, default=0, help="first calibrate the gate (tritonship calibrate) with this many rounds"
    )
    parser.add_argument(
        "--max-calibrated-budget-s", type=float, help="let the gate take the budget its calibration asks, up to this"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "gate_quality.json")
    args = parser.parse_args()
    limits = (
        {}
        if args.limit_pct is None
        else dict.fromkeys(("max_p99_regression_pct", "max_throughput_regression_pct"), args.limit_pct)
    )
    if args.max_calibrated_budget_s is not None:
        limits["max_calibrated_budget_s"] = args.max_calibrated_budget_s
    gate_settings = GateSettings.from_flat(**limits)
    results = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedStack(replicas=2, gate=True) as stack:
        tmp_path = Path(tmp)
        repo_uri = f"s3://{stack.bucket}"
        repo = ModelRepository(repo_uri, stack.s3)
        gpu_base = gpu_model(tmp_path) if args.gpu else demo_model(tmp_path) if args.demo_model else None
        stable = model_folder(tmp_path, "stable", 0, gpu_base)
        version = publish(RunContext(repo_uri, "", s3=stack.s3), folder=stable).version
        repo.copy_to_production(MODEL, version)
        config = model_config.pin_version(model_config.parse_pbtxt((stable / "config.pbtxt").read_text()), version)
        repo.write_desired_config(MODEL, config, None)
        for server in (stack.gate, *stack.replicas):
            TritonAdmin(server.http_url).load(MODEL, config)
        stable_us = stable_latency_us(stack, stable)
        stable_us["busy_iteration_us"] = {
            "here": latency_injection.iteration_us(),
            "in the gate server": served_iteration_us(stack, tmp_path, gpu_base),
        }
        per_iteration_us = stable_us["busy_iteration_us"]["in the gate server"]
        base_us = args.base_us or stable_us[args.size_by]
        TritonAdmin(stack.gate.http_url).unload(MODEL)
        print(
            f"stable latency: median {stable_us['median']:.0f} us, p99 {stable_us['p99']:.0f} us; a busy-work iteration {per_iteration_us:.2f} us in the server; injections are "
            f"percents of {f'{args.base_us:g} us' if args.base_us else 'the ' + args.size_by}; gate settings {gate_settings}",
            flush=True,
        )
        candidates: dict[int, int] = {}
        golden = dict(np.load(stable / "1" / "golden.npz"))
        request = {k[3:]: v[:1] for k, v in golden.items() if k.startswith("in:")}
        outputs = [k[4:] for k in golden if k.startswith("out:")]
        urls = [s.http_url for s in stack.replicas]
        with LiveTraffic(urls, MODEL, request, outputs) as client, busy_cpus(args.busy):
            if args.calibrate:
                found = calibrate(
                    RunContext(repo_uri, MODEL, gate=stack.gate.replica, s3=stack.s3),
                    gate_settings,
                    rounds=args.calibrate,
                )
                stable_us["calibration"] = found.to_dict() | {"budgets_s": budgets(found, gate_settings)}
                print(f"calibration: {stable_us['calibration']}", flush=True)
            for design in args.designs.split(","):
                plan = args.injections if design == "duet" else args.alternating_injections
                settings = dataclasses.replace(gate_settings, design=design)
                for pct, trials in (map(int, item.split(":")) for item in plan.split(",")):
                    delay_us = int(base_us * pct / 100)
                    if pct not in candidates:
                        folder = model_folder(tmp_path, f"c{pct}", delay_us, gpu_base, per_iteration_us)
                        candidates[pct] = publish(
                            RunContext(repo_uri, "", s3=stack.s3, run_id=f"inject-{pct}"), folder=folder
                        ).version
                    # one release at a time: stage takes the model's lease, given back after the trials
                    stage(RunContext(repo_uri, MODEL, candidates[pct], stack.gate.replica, stack.s3, f"inject-{pct}"))
                    verdicts, seconds, p99_changes, throughput_losses, details = [], [], [], [], []
                    on_gate = RunContext(
                        repo_uri, MODEL, candidates[pct], Replica("gate", stack.gate.http_url), stack.s3
                    )
                    for trial in range(trials):
                        started = time.monotonic()
                        result = gate(on_gate, settings)
                        verdicts.append(result.verdict)
                        seconds.append(time.monotonic() - started)
                        if result.p99_regression_pct is not None:
                            p99_changes.append(result.p99_regression_pct)
                        if result.throughput_regression_pct is not None:
                            throughput_losses.append(result.throughput_regression_pct)
                        details.append(
                            {
                                "verdict": result.verdict,
                                "seconds": seconds[-1],
                                "rounds": result.rounds,
                                "stopped": result.stopped,
                                "budget_s": result.settings.get("budget_s"),
                                "reasons": result.reasons,
                                "effects": [e.to_dict() for e in result.effects],
                                "round_p99_log_ratios": round_log_ratios(result),
                                "measurement_seconds": result.measurement_seconds,
                                "stable_load_seconds": result.stable_load_seconds,
                            }
                        )
                        print(
                            f"  {design} +{pct}% trial {trial + 1}: {result.verdict} after {result.rounds} rounds, "
                            f"{seconds[-1]:.0f} s ({'; '.join(result.reasons)[:140]})",
                            flush=True,
                        )
                    unload_candidate(stack.gate.http_url, MODEL)
                    repo.release_lease(MODEL, f"inject-{pct}")
                    results.append(
                        {
                            "design": design,
                            "injected_pct": pct,
                            "delay_us": delay_us,
                            "trials": len(verdicts),
                            "pass": verdicts.count("pass"),
                            "fail": verdicts.count("fail"),
                            "inconclusive": verdicts.count("inconclusive"),
                            "median_observed_p99_change_pct": statistics.median(p99_changes) if p99_changes else None,
                            "median_observed_throughput_loss_pct": (
                                statistics.median(throughput_losses) if throughput_losses else None
                            ),
                            "median_decision_seconds": statistics.median(seconds),
                            "max_decision_seconds": max(seconds),
                            "trial_details": details,
                        }
                    )
                    write(args.out, stable_us, gate_settings, args, results)  # after every group: a crash loses nothing
        client_failures = len(client.failures)
    header = (
        f"{'design':>11} {'injected':>8} {'trials':>6} {'pass':>5} {'fail':>5} {'inconcl.':>8} {'obs. p99':>9} "
        f"{'obs. thr.':>9} {'median s':>8} {'max s':>6}"
    )
    print("\n" + header)
    for r in results:
        p99, loss = r["median_observed_p99_change_pct"], r["median_observed_throughput_loss_pct"]
        print(
            f"{r['design']:>11} {'+' + str(r['injected_pct']) + '%':>8} {r['trials']:>6} {r['pass']:>5} {r['fail']:>5} "
            f"{r['inconclusive']:>8} {'-' if p99 is None else f'{p99:+.1f}%':>9} {'-' if loss is None else f'{-loss:+.1f}%':>9} "
            f"{r['median_decision_seconds']:>8.1f} {r['max_decision_seconds']:>6.1f}"
        )
    for design in args.designs.split(","):
        ratios = [
            x
            for r in results
            if r["design"] == design and r["injected_pct"] == 0
            for t in r["trial_details"]
            for x in t["round_p99_log_ratios"]
        ]
        if len(ratios) > 1:
            print(
                f"A/A rounds, {design}: standard deviation of log(p99 ratio) {np.std(ratios, ddof=1):.3f} "
                f"over {len(ratios)} rounds"
            )
    print(f"steady client: {client.total} requests to the production replicas, {client_failures} failed")
    write(args.out, stable_us, gate_settings, args, results, {"requests": client.total, "failures": client_failures})


def write(
    out: Path, stable_us: dict, gate_settings: GateSettings, args, results: list, client: dict | None = None
) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "stable_median_us": stable_us["median"],
        "stable_p99_us": stable_us["p99"],
        "busy_iteration_us": stable_us.get("busy_iteration_us"),
        "calibration": stable_us.get("calibration"),
        "injections_sized_by": f"{args.base_us:g} us" if args.base_us else args.size_by,
        "gate_settings": dataclasses.asdict(gate_settings),
        "arguments": vars(args) | {"out": str(out)},
        "steady_client": client,
        "results": results,
    }
    out.write_text(json.dumps(report, indent=2, default=lambda o: o.tolist() if hasattr(o, "tolist") else str(o)))


if __name__ == "__main__":
    main()
