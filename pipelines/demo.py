"""The demo: five releases of the users' BERT4Rec recommender through the whole KFP pipeline on the embedded
stack, with live clients sending long histories to the production replicas from v1 on.

The recommender is trained (pipelines/samples/bert4rec/training.py: synthetic sessions with structure, about half a
minute a model, v1's first and the others while v1 is released), and every release is judged on held-out labelled sessions in S3 as well as on speed.
v1 is the first release (absolute limits and quality floors only), v2 a retrain with another seed (promoted after
its canary), v3 a deliberately slower model (rejected by the gate; v2 keeps serving), v4 v2's answers at a cost
that grows with the history's length beyond 16 positions: exactly v2's work at the gate's 8, and its canary
fails on the clients' 32-40 (every replica back on v2), v5 a retrain on a corrupted log, as fast and as faithful
to itself, rejected by the quality check. Then a client asks production which version answers. The demo checks
that story and exits non-zero, saying what differed, when it does not hold.
"""

from __future__ import annotations

import json
import multiprocessing
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from components.errors import TritonshipError
from components.serving.triton_admin import TritonAdmin
from components.settings import DEFAULT_INTRA_OP_THREAD_COUNTS
from pipelines.live_traffic import LIVE_OUTPUTS, LiveTraffic, live_request
from pipelines.local import LocalRun, run_local
from pipelines.samples import bert4rec
from pipelines.stack import EmbeddedStack

MODEL = "bert4rec"
# (label, model factory, its trained weights, what the release must end as, and what must fail it: "speed" the
# gate's speed limits (v3 has v2's weights: its quality passes), "quality" the quality check alone, its speed within
# every limit)
RELEASES = [
    ("v1: first release", "pipelines.samples.bert4rec:demo_v1", "seed0", "promoted", ""),
    ("v2: retrained", "pipelines.samples.bert4rec:demo_v2", "seed1", "promoted", ""),
    ("v3: deliberately slower", "pipelines.samples.bert4rec:demo_v3_slow", "seed1", "rejected", "speed"),
    ("v4: slow on long histories", "pipelines.samples.bert4rec:demo_v4_long_history", "seed1", "reverted", "canary"),
    ("v5: retrained on a corrupted log", "pipelines.samples.bert4rec:demo_v2", "corrupted", "rejected", "quality"),
]
TRAINED = {"seed0": (0, False), "seed1": (1, False), "corrupted": (1, True)}  # checkpoint -> (seed, corrupted)
EVAL_ROWS = 4000
# Rounds for the demo's traffic (30 requests/s a replica; production's rounds last a minute), and a latency limit
# for rounds that short: 60 requests leave a round's mean latency ±15% off by itself here, where the benchmark's
# 900 give ±5% (benchmarks/canary_quality.py). v4 is several times slower on live traffic.
DEMO_CANARY = {
    "canary_round_s": 2.0,
    "canary_max_bake_s": 40.0,
    "canary_min_requests": 20,
    "canary_max_latency_regression_pct": 75.0,
}


def demo_parameters(
    stack: EmbeddedStack,
    model_source: str,
    signature: str = json.dumps(bert4rec.DYNAMIC_SIGNATURE),
    model_name: str = MODEL,
    checkpoint: str = "",
    eval_data: str = "",
) -> dict[str, Any]:
    """The pipeline's parameters for the embedded stack: CPU TorchScript served by Triton's PyTorch backend; with
    `eval_data`, judged on it by the demo's quality spec too."""
    return {
        "model_source": model_source,
        "checkpoint": checkpoint,
        "eval_data": eval_data,
        "quality_spec": bert4rec.QUALITY_SPEC_TEXT if eval_data else "",
        "signature": signature,
        "model_name": model_name,
        "compile_target": "torchscript",
        "precision": "fp32",
        "compile_device": "cpu",
        "serving_torch": stack.serving_torch,  # with --param compile_target=aoti, the package must be for it
        "repository": f"s3://{stack.bucket}",
        "s3_endpoint": stack.s3.endpoint_url,
        "replicas": ",".join(s.replica_spec for s in stack.replicas),
        "gate": stack.gate.replica_spec,  # with its metrics port: the reports show the gate server's CPU
        "max_p99_ms": 50.0,
        # at concurrency 1 batching cannot help: the default twice and two other settings show the step
        # (benchmarks/tuning.py measures it at a load where it pays)
        "tune_budget": 4,
        "tune_intra_op_threads": replica_thread_counts(stack),
        **DEMO_CANARY,
    }


def replica_thread_counts(stack: EmbeddedStack) -> str:
    """Tune's intra-op thread counts: those a production replica's CPUs run at once. Each replica runs on CPUs of
    its own (pipelines/stack.py) and the gate on all, so a count tune finds faster on the gate can contend on a
    replica: a demo run promoted v2 with 2 threads for +5% on the gate, and on its one-CPU replicas v2 then
    answered the live clients in 1.4-1.7 ms, where one thread answered in 0.7-1.1 ms."""
    fewest = min((len(cpus) for cpus in stack.replica_cpus if cpus), default=None)
    return ",".join(str(n) for n in DEFAULT_INTRA_OP_THREAD_COUNTS if fewest is None or n <= fewest)


def summary_row(label: str, run: LocalRun) -> list[str]:
    verdict = run.verdict or {}
    median = verdict.get("candidate_summary") or {}
    outcome = outcome_of(run)
    return [
        label,
        str(run.version),
        f"{verdict.get('verdict', '-')} ({outcome})",
        f"{median['p99_ms']:.2f}" if median.get("p99_ms") else "-",
        f"{median['throughput']:,.0f}" if median.get("throughput") else "-",
        _hit_rate(verdict.get("quality")),
        "; ".join(verdict.get("reasons", [])),
    ]


def _hit_rate(quality: dict[str, Any] | None) -> str:
    """The candidate's first metric on the whole set, with its change against stable."""
    figures = next((m for m in (quality or {}).get("metrics", []) if not m.get("slice") and "candidate" in m), None)
    if figures is None:
        return "-"
    change = f" ({figures['difference']:+.3f})" if figures.get("difference") is not None else ""
    return f"{figures['candidate']:.3f}{change}"


def print_table(console: Console, table: Table, rows: list[list[str]]) -> None:
    """The table; where it would wrap (no terminal, as in CI and KFP logs, or a narrow one), the reasons
    leave the table and follow it in full, one plain line each."""
    wide = console.is_terminal and console.measure(table).maximum <= console.width
    if wide:
        console.print(table)
        return
    plain = Table(*[c.header for c in table.columns[:-1]], title=table.title)
    for row in rows:
        plain.add_row(*row[:-1])
    console.print(plain, width=max(console.width, 100))
    for row in rows:
        console.print(f"{row[0]}: {row[-1] or '-'}", soft_wrap=True, highlight=False)


def outcome_of(run: LocalRun) -> str:
    if run.promoted:
        return "promoted"
    if run.rejected:
        return "rejected"
    return "reverted" if run.promotion else "neither promoted nor rejected"


def canary_line(run: LocalRun) -> str:
    canary = (run.promotion or {}).get("canary")
    if not canary:
        return "no canary"
    from components.release.promote import canary_report
    from components.release.promote.records import CanaryResult

    return canary_report.summary(CanaryResult.from_json(json.dumps(canary)))


def story_differences(
    runs: list[LocalRun],
    served: list[int | None],
    backends: list[dict[str, str]] | None = None,
    client_failures: int = 0,
) -> list[str]:
    """Where the releases did not end as the demo's story says (empty when they did). `backends`: each
    replica's served models and the backend each runs, as the server reports them."""
    problems = [f"{client_failures} live client requests failed"] if client_failures else []
    problems += [
        f"{label} was not decided by its {decider} (failed: {', '.join(sorted(_deciders(run))) or 'nothing'})"
        for (label, _source, _weights, _expected, decider), run in zip(RELEASES, runs, strict=False)
        if decider in ("speed", "quality") and _deciders(run) != {decider}
    ]
    for replica, models in enumerate(backends or []):
        if "pytorch_libtorch/pytorch" not in models.values():
            problems.append(f"prod-{replica} serves no model with Triton's PyTorch backend: {models}")
    for (label, _source, _weights, expected, _decider), run in zip(RELEASES, runs, strict=True):
        outcome = outcome_of(run)
        if outcome != expected:
            # a promotion's outcome is the canary's to explain, a verdict's the gate's
            said = canary_line(run) if run.promotion else "; ".join((run.verdict or {}).get("reasons", []))
            problems.append(f"{label} was {outcome}, expected {expected} ({said or 'no verdict'})")
    v2 = runs[1].version if len(runs) > 1 else None
    if served != [v2] * len(served):
        problems.append(f"production answered with version(s) {served}, expected v{v2} on every replica")
    return problems


def _deciders(run: LocalRun) -> set[str]:
    """Which of the gate's two checks failed the release: speed, quality, both, or neither."""
    verdict = run.verdict or {}
    failed = {"speed"} if verdict.get("speed_verdict", verdict.get("verdict")) == "fail" else set()
    return failed | ({"quality"} if (verdict.get("quality") or {}).get("decision") == "fail" else set())


def trained_checkpoint(
    label: str, seed: int, corrupted: bool, workdir: Path, steps: int | None = None
) -> tuple[Path, float, float]:
    """One of the releases' models trained and saved (in the training process), for `steps` batches (None: the
    training's own number): its file, the seconds it took and its hit rate@10 on held-out sessions."""
    from pipelines.samples.bert4rec import training

    took = time.monotonic()
    model = training.train(seed, steps or training.DEFAULT_STEPS, corrupted)
    training.save_checkpoint(model, workdir / f"{label}.pt")
    hit_rate = training.hit_rate_at_10(model, training.eval_set(1000, seed=7))
    return workdir / f"{label}.pt", time.monotonic() - took, hit_rate


class Training:
    """The releases' models, trained one after another (TRAINED's order) in a process of their own, so that v1's
    release, which needs only the first, runs while the others train. Each is in S3 once asked for (a task reads an
    S3 URI alike in a process and in a container); `all()` waits for every one, so no later release is measured
    beside the training."""

    def __init__(self, console: Console, stack: EmbeddedStack, workdir: Path) -> None:
        self.console, self.stack = console, stack
        self.pool = multiprocessing.get_context("spawn").Pool(1)
        self.pending = {
            label: self.pool.apply_async(trained_checkpoint, (label, seed, corrupted, workdir))
            for label, (seed, corrupted) in TRAINED.items()
        }
        self.uris: dict[str, str] = {}

    def checkpoint(self, label: str) -> str:
        if label not in self.uris:
            path, seconds, hit_rate = self.pending[label].get()
            self.stack.s3.client().upload_file(str(path), self.stack.bucket, f"checkpoints/{label}.pt")
            self.uris[label] = f"s3://{self.stack.bucket}/checkpoints/{label}.pt"
            self.console.print(
                f"  trained {label} in {seconds:.0f} s: hit rate@10 {hit_rate:.3f} on held-out sessions",
                highlight=False,
            )
        return self.uris[label]

    def all(self) -> None:
        for label in TRAINED:
            self.checkpoint(label)

    def close(self) -> None:
        """Stops the training process, at once: after a failed release nothing waits for a model."""
        self.pool.terminate()
        self.pool.join()


def upload_eval(stack: EmbeddedStack, workdir: Path) -> str:
    """The held-out labelled sessions the quality check judges every release on, in S3."""
    from pipelines.samples.bert4rec import training

    local = workdir / "eval-sessions.parquet"
    training.write_eval(training.eval_set(EVAL_ROWS, seed=1000), local)
    stack.s3.client().upload_file(str(local), stack.bucket, "eval/bert4rec-sessions.parquet")
    return f"s3://{stack.bucket}/eval/bert4rec-sessions.parquet"


# What the story sets for each release and for the stack: the demo refuses them as parameters.
SET_BY_THE_STORY = (
    "model_source",
    "checkpoint",
    "signature",
    "model_name",
    "eval_data",
    "quality_spec",
    "repository",
    "s3_endpoint",
    "replicas",
    "gate",
)


def run_demo(
    console: Console, workdir: Path | None = None, runner: str = "subprocess", overrides: dict[str, Any] | None = None
) -> int:
    """The five releases; `runner` "docker" runs every pipeline task in the project's images (built here);
    `overrides`, pipeline parameters every release takes (not those of SET_BY_THE_STORY)."""
    overrides = overrides or {}
    told = sorted(set(overrides) & set(SET_BY_THE_STORY))
    if told:
        raise TritonshipError(f"the demo's story sets {', '.join(told)} itself; give the other parameters only.")
    workdir = workdir or Path(tempfile.mkdtemp(prefix="tritonship-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)  # --workdir may name a folder that does not exist yet
    table = Table(title=f"tritonship demo: five releases of '{MODEL}' (BERT4Rec on transformers)")
    for column in ("release", "version", "verdict", "p99 ms", "infer/s", "hit rate@10", "reason"):
        table.add_column(column)
    runs: list[LocalRun] = []
    rows: list[list[str]] = []
    started = time.monotonic()
    with (
        console.status("starting S3, two production Tritons and a gate Triton") as status,
        EmbeddedStack(replicas=2, gate=True) as stack,
    ):
        console.print(
            f"embedded stack up: S3 {stack.s3.endpoint_url}, production "
            f"{', '.join(s.http_url for s in stack.replicas)}, gate {stack.gate.http_url}"
        )
        status.update("training the recommender on synthetic sessions (three models, v1's first)")
        clients = LiveTraffic(
            [s.http_url for s in stack.replicas], MODEL, live_request, LIVE_OUTPUTS, rate_hz=30, cpus=stack.replica_cpus
        )
        with ExitStack() as live:
            training = Training(console, stack, workdir)
            live.callback(training.close)  # also when a release fails: the training process stops
            eval_data = upload_eval(stack, workdir)
            for label, source, weights, _expected, _decider in RELEASES:
                if runs:
                    training.all()
                status.update(
                    f"releasing {label} (export, compile, publish, stage, quality, tune, gate, canary, promote/reject)"
                )
                parameters = (
                    demo_parameters(stack, source, checkpoint=training.checkpoint(weights), eval_data=eval_data)
                    | overrides
                )
                run = run_local(parameters, workdir / "pipeline-runs", env=stack.env(), runner=runner)
                runs.append(run)
                rows.append(summary_row(label, run))
                table.add_row(*rows[-1])
                verdict = run.verdict["verdict"] if run.verdict else "-"
                console.print(f"  {label}: {verdict}  ({run.root})", soft_wrap=True)
                if run.promotion:
                    console.print(f"    {canary_line(run)}", soft_wrap=True, highlight=False)
                if len(runs) == 1:  # v1 serves: the live clients start
                    live.enter_context(clients)
        request = {k: v[:1] for k, v in bert4rec_request().items()}
        served = [_served(s.http_url, request) for s in stack.replicas]
        backends = [served_backends(s.http_url) for s in stack.replicas]
    print_table(console, table, rows)
    console.print(
        f"live clients (histories of 32-40 items): {clients.total} requests answered, by version {dict(clients.versions)}, "
        f"{len(clients.failures)} failed"
    )
    console.print(f"a client request to each production replica was answered by version(s) {served}")
    console.print(f"what prod-0 serves, as its model configs say (platform/backend): {backends[0]}", soft_wrap=True)
    console.print("gate reports:")
    for run in runs:
        console.print(f"  {run.root / 'gate-op' / 'report_html'}", soft_wrap=True, highlight=False)
    console.print(f"finished in {time.monotonic() - started:.0f} s")
    problems = story_differences(runs, served, backends, len(clients.failures))
    for problem in problems:
        console.print(f"[red]the demo did not end as its story says: {problem}[/]", soft_wrap=True)
    return 1 if problems else 0


def bert4rec_request() -> dict[str, np.ndarray]:
    from components.model.signature import Signature

    return Signature.from_dict(bert4rec.MODEL_SIGNATURE).example_inputs(1, seed=7)


def served_backends(url: str) -> dict[str, str]:
    """Each READY model of a server and `platform/backend` from its own model config."""
    with TritonAdmin(url) as admin:
        ready = sorted(admin.ready_models())
        configs = {name: admin.model_config(name) for name in ready}
    return {name: f"{c.get('platform', '')}/{c.get('backend', '')}" for name, c in configs.items()}


def _served(url: str, request: dict[str, np.ndarray]) -> int | None:
    try:
        return TritonAdmin(url).served_version(MODEL, request, ["topk_indices"])
    except Exception:  # a replica that does not answer is part of the story's check, not a crash
        return None
