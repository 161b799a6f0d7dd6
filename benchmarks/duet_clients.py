"""Where should the duet's two perf_analyzers run? A/A duet rounds with both clients on the same CPUs,
a different group each round (the gate's way), on always the same CPUs, and left to the scheduler, on a
machine kept busy by N spinning processes.

    .venv/bin/python benchmarks/duet_clients.py [--rounds 30] [--busy 1]

Stable and candidate are the same traced MLP (Triton's PyTorch backend), both loaded on the gate
server; a client sends steady traffic to both production replicas, as in benchmarks/gate_quality.py.
Rounds take the placements in turn (and alternate which client starts first). For each placement it
prints the standard deviation over rounds of log(candidate / stable) for p99, p50 and throughput: the
noise the gate's interval has to average away. Writes benchmarks/results/duet_clients_busy<N>.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.gate_quality import MODEL, busy_cpus
from components.model import model_config
from components.release.effects import WARM_UP_REQUESTS, round_requests
from components.release.publish import publish
from components.release.run_context import RunContext
from components.release.stage import stage
from components.repository import ModelRepository, candidate_name
from components.serving import perf
from components.serving.tools import shared_client_cpus
from components.serving.triton_admin import TritonAdmin
from components.settings import GateSettings
from pipelines.live_traffic import LiveTraffic
from pipelines.stack import EmbeddedStack
from tests.models import mlp_folder

PLACEMENTS = ("rotating", "fixed", "apart")  # same CPUs, a new group each round / always the same / unpinned
X = {"x": np.ones((1, 16), np.float32)}  # the input of mlp_folder's MLP (tests/models.py)


def log_ratios(candidate: np.ndarray, stable: np.ndarray, c_s: float, s_s: float) -> dict[str, float]:
    p99 = lambda a: np.percentile(a, 99, method="inverted_cdf")  # noqa: E731
    return {
        "p99": float(np.log(p99(candidate) / p99(stable))),
        "p50": float(np.log(np.median(candidate) / np.median(stable))),
        "throughput": float(np.log((candidate.size / c_s) / (stable.size / s_s))),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=30, help="rounds per placement")
    parser.add_argument("--busy", type=int, default=1, help="processes that keep a CPU busy throughout")
    args = parser.parse_args()
    load = GateSettings().load
    rows = []
    with tempfile.TemporaryDirectory() as tmp, EmbeddedStack(replicas=2, gate=True) as stack:
        tmp_path, uri = Path(tmp), f"s3://{stack.bucket}"
        (tmp_path / "stable").mkdir()
        stable = mlp_folder(tmp_path / "stable", MODEL)
        version = publish(RunContext(uri, "", s3=stack.s3), folder=stable).version
        ModelRepository(uri, stack.s3).copy_to_production(MODEL, version)
        config = model_config.pin_version(model_config.parse_pbtxt((stable / "config.pbtxt").read_text()), version)
        ModelRepository(uri, stack.s3).write_desired_config(MODEL, config, None)
        for server in (stack.gate, *stack.replicas):
            TritonAdmin(server.http_url).load(MODEL, config)
        (tmp_path / "candidate").mkdir()
        candidate = publish(
            RunContext(uri, "", s3=stack.s3, run_id="aa"), folder=mlp_folder(tmp_path / "candidate", MODEL)
        ).version
        stage(RunContext(uri, MODEL, candidate, stack.gate.replica, stack.s3, "aa"))
        targets = [perf.Target(candidate_name(MODEL), str(candidate)), perf.Target(MODEL, str(version))]
        data = perf.write_input_data(X, tmp_path / "input.json", batched=True)
        with TritonAdmin(stack.gate.http_url) as admin:
            for target in targets:
                for _ in range(WARM_UP_REQUESTS):
                    admin.infer(target.model, X, ["y"], target.version)
        with LiveTraffic([s.http_url for s in stack.replicas], MODEL, X, ["y"]), busy_cpus(args.busy):
            for i in range(len(PLACEMENTS) * args.rounds):
                placement, order = PLACEMENTS[i % 3], targets if i % 2 == 0 else targets[::-1]
                cpus = {"rotating": shared_client_cpus(i // 3), "fixed": shared_client_cpus(0), "apart": None}
                runs = perf.measure_together(stack.gate.http_url, order, data, load, client_cpus=cpus[placement])
                by_model = {r.model: r for r in runs}
                c_ms, s_ms, c_s, s_s = round_requests(
                    by_model[targets[0].model].requests, by_model[targets[1].model].requests, duet=True
                )
                rows.append(
                    {
                        "clients": placement,
                        "candidate_first": order[0] == targets[0],
                        "requests": [int(c_ms.size), int(s_ms.size)],
                        **log_ratios(c_ms, s_ms, c_s, s_s),
                    }
                )
                print(rows[-1], flush=True)
    summary = {
        placement: {
            k: float(np.std([r[k] for r in rows if r["clients"] == placement], ddof=1))
            for k in ("p99", "p50", "throughput")
        }
        for placement in PLACEMENTS
    }
    for placement, sds in summary.items():
        print(
            f"clients {placement:>8}: SD of log(candidate/stable) over {args.rounds} rounds: "
            + ", ".join(f"{k} {v:.3f}" for k, v in sds.items())
        )
    out = Path(__file__).parent / "results" / f"duet_clients_busy{args.busy}.json"
    out.write_text(json.dumps({"arguments": vars(args), "summary": summary, "rounds": rows}, indent=1))


if __name__ == "__main__":
    main()
