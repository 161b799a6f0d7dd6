"""The recommender as a Triton ensemble, released end to end on the embedded stack:

    .venv/bin/python -m pipelines.examples.ensemble_release

v1 (first release) and v2 (retrained) are promoted with their pre/post-processing steps as one release;
v3 ships a wrong id map in its postprocessing, fails the accuracy check and is rejected. At the end it
asks each production replica which version of the ensemble answers (v2) and prints the members of the
last promotion. About 2 minutes on a 2-core machine. (tests/test_ensemble.py runs a client throughout.)
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from components.release.gate.gate import gate
from components.release.promote.promote import promote, reject
from components.release.promote.settings import PromoteSettings
from components.release.publish import publish
from components.release.run_context import RunContext
from components.release.stage import stage
from components.repository import ModelRepository
from components.serving.triton_admin import TritonAdmin
from components.settings import GateSettings, Thresholds
from pipelines.samples import recsys
from pipelines.stack import EmbeddedStack

FIRST = GateSettings(thresholds=Thresholds(max_p99_ms=200))
NEXT = GateSettings()


def main() -> None:
    console = Console()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedStack(replicas=2, gate=True) as stack:
        repository = f"s3://{stack.bucket}"
        replicas = [s.replica for s in stack.replicas]
        releases = [
            ("v1", "recommender_v1", False, FIRST),
            ("v2", "recommender_v2", False, NEXT),
            ("v3 (wrong id map)", "recommender_v2", True, NEXT),
        ]
        rows = []
        for label, factory, broken, settings in releases:
            with console.status(f"{label}: export, compile, assemble the ensemble"):
                bundle = recsys.build_bundle(Path(tmp) / label.split()[0], factory, wrong_id_map=broken)
            with console.status(f"{label}: publish, stage, gate"):
                version = publish(RunContext(repository, "", s3=stack.s3), folder=bundle).version
                context = RunContext(repository, "recsys", version, stack.gate.replica, stack.s3)
                staged = stage(context)
                verdict = gate(context, settings, staged)
            if verdict.verdict == "pass":
                with console.status(f"{label}: promoting to {len(replicas)} replicas"):
                    promote(context, PromoteSettings.from_flat(canary=False), replicas=replicas, verdict="pass")
            else:
                reject(context, verdict.verdict, verdict.reasons)
            summary = verdict.candidate.summary()
            rows.append(
                [
                    label,
                    str(version),
                    verdict.verdict,
                    f"{summary['p99_ms']:.2f}" if summary["p99_ms"] else "-",
                    "; ".join(verdict.reasons)[:80],
                ]
            )
        history = recsys.histories(1, seed=3)
        served = Counter(
            TritonAdmin(s.http_url).served_version("recsys", {"history": history}, ["recommended"])
            for s in stack.replicas
        )
        repo = ModelRepository(repository, stack.s3)
        table = Table("release", "version", "verdict", "p99 ms", "reasons", title="recsys ensemble releases")
        for row in rows:
            table.add_row(*row)
        console.print(table)
        console.print(
            f"production replicas serve recsys v{', v'.join(map(str, served))}; members of the last "
            f"promotion: {[e for e in repo.history('recsys') if e['event'] == 'promoted'][-1]['members']}"
        )


if __name__ == "__main__":
    main()
