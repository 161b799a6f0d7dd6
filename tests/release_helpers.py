"""Helpers for release tests: run the steps as the pipeline does (the live client is pipelines/live_traffic.py)."""

from __future__ import annotations

import dataclasses
import re
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from components.release.gate.gate import gate
from components.release.promote.promote import promote
from components.release.promote.settings import PromoteSettings
from components.release.publish import publish
from components.release.results import GateResult, StageResult
from components.release.run_context import RunContext
from components.release.stage import stage
from components.serving.replicas import Replica
from components.serving.triton_admin import TritonAdmin
from components.settings import GateSettings, Thresholds
from pipelines.stack import EmbeddedStack

# The gate's defaults (benchmarks/gate_quality.py measures them on this machine).
TEST_GATE = GateSettings()
# A release judged on a far-off absolute limit only (short windows: the decision is never close), for tests
# of the release machinery, where the gate's statistics are not the subject. Those are measured by
# benchmarks/gate_quality.py and tested by the equal and slow candidates of test_release.py with TEST_GATE.
ABSOLUTE_GATE = GateSettings(
    load=dataclasses.replace(TEST_GATE.load, window_ms=250),
    thresholds=Thresholds(max_p99_ms=1000, max_p99_regression_pct=None, max_throughput_regression_pct=None),
)
# promote as `tritonship promote --no-canary`, for tests whose subject is not the canary (it is on by default)
NO_CANARY = PromoteSettings.from_flat(canary=False)


def loaded_models(stack: EmbeddedStack) -> dict[str, set[str]]:
    """The READY model names on each Triton of the stack (server name -> names)."""
    found = {}
    for server in (stack.gate, *stack.replicas):
        with TritonAdmin(server.http_url, timeout=30, retries=1) as admin:
            found[server.name] = set(admin.ready_models())
    return found


def finish_every_release(stack: EmbeddedStack, loaded_before: dict[str, set[str]]) -> None:
    """What the pipeline's exit handler does, for every release a test began, and more: every model the test
    loaded on any Triton of the stack is unloaded (a gate candidate, a promoted version, a restarted replica's),
    and leases are given back. Run after each test whatever its outcome, so none inherits another's state:
    no stub processes, memory or CPU of earlier tests under a later test's measurement."""
    for server, ready in loaded_models(stack).items():
        with TritonAdmin(stack.triton(server).http_url, timeout=30, retries=1) as admin:
            new = ready - loaded_before.get(server, set())
            ensembles = {n for n in new if admin.model_config(n).get("platform") == "ensemble"}
            for name in [*sorted(ensembles), *sorted(new - ensembles)]:  # an ensemble before its members
                admin.unload(name)
    client = stack.s3.client()
    # a repository at the bucket's root or one folder down: its leases/ alone is listed, not the whole bucket,
    # which the suite fills with thousands of objects
    top = client.list_objects_v2(Bucket=stack.bucket, Delimiter="/").get("CommonPrefixes", [])
    for folder in ["", *(p["Prefix"] for p in top)]:
        listed = client.list_objects_v2(Bucket=stack.bucket, Prefix=f"{folder}leases/")
        for item in listed.get("Contents", []):
            if re.fullmatch(r"[^/]+\.json", item["Key"].removeprefix(f"{folder}leases/")):
                client.delete_object(Bucket=stack.bucket, Key=item["Key"])


def wait_for(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    """Until `condition()` holds (polled); an AssertionError naming `what` when `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} within {timeout_s} s"
        time.sleep(0.05)


def unique(prefix: str = "r") -> str:
    return f"{prefix}{uuid.uuid4().hex[:8]}"


def replicas(stack: EmbeddedStack) -> list[Replica]:
    return [s.replica for s in stack.replicas]


def repository(stack: EmbeddedStack) -> str:
    return f"s3://{stack.bucket}"


def stage_and_gate(
    stack: EmbeddedStack, folder: Path, settings: GateSettings = TEST_GATE, out: Path | None = None
) -> tuple[int, StageResult, GateResult]:
    published = publish(RunContext(repository(stack), "", s3=stack.s3), folder=folder)
    context = RunContext(repository(stack), published.model, published.version, stack.gate.replica, stack.s3)
    staged = stage(context)
    verdict = gate(context, settings, staged, out)  # with the gate's metrics: its GPU/CPU figures
    return published.version, staged, verdict


def install_stable(stack: EmbeddedStack, folder: Path) -> int:
    """A first version for a test to release over, served by every replica: published, staged (with its
    accuracy check) and promoted without a measurement. For tests whose subject comes after it; the gated
    first release has tests of its own (test_release, test_pipeline, test_admin_lock, test_server_metrics)."""
    published = publish(RunContext(repository(stack), "", s3=stack.s3), folder=folder)
    staged = stage(RunContext(repository(stack), published.model, published.version, stack.gate.replica, stack.s3))
    assert staged.accuracy_passed, staged.load_error
    context = RunContext(repository(stack), published.model, published.version, stack.gate.replica, stack.s3)
    promote(context, NO_CANARY, replicas=replicas(stack), verdict="pass")
    return published.version


def release(stack: EmbeddedStack, folder: Path, settings: GateSettings = TEST_GATE) -> int:
    """publish -> stage -> gate -> promote; asserts the verdict is pass."""
    version, _staged, verdict = stage_and_gate(stack, folder, settings)
    assert verdict.verdict == "pass", verdict.reasons
    context = RunContext(repository(stack), verdict.model, version, stack.gate.replica, stack.s3)
    promote(context, NO_CANARY, replicas=replicas(stack), verdict=verdict.verdict)
    return version


def quick_gate_settings() -> dict:
    """The gate settings settings_op hands the pipeline's gate task (whole, as to_dict), with 250 ms windows."""
    from components.release.step_settings import PIPELINE_STEPS

    chosen = GateSettings.from_dict(PIPELINE_STEPS.settings({})["gate"])
    return dataclasses.replace(chosen, load=dataclasses.replace(chosen.load, window_ms=250)).to_dict()
