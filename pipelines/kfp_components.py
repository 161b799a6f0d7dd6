"""The release pipeline's KFP components: one lightweight @dsl.component per step (export and compile, which take
the user's model, are pipelines/kfp_model_components.py's).

Each imports its step from `components` inside its body: the images (images/versions.yaml) have the project
installed, and KFP's local runner runs the very same functions here. The wiring is pipelines/pipeline.py."""

from typing import NamedTuple

from kfp import dsl
from kfp.dsl import HTML, Input, Markdown, Metrics, Model, Output

from pipelines.images import image


def step(kind: str):
    """A step's @dsl.component in the `kind` image, which has kfp (images/*.Dockerfile): no pip install per task."""
    return dsl.component(base_image=image(kind), install_kfp_package=False)


@step("tools")
def publish_op(compiled: Input[Model], repository: str, s3_endpoint: str, run_id: str, settings: dict) -> NamedTuple(
    "Published", [("version", int), ("uri", str)]
):
    """Publish the compiled folder as a new immutable candidate version."""
    from collections import namedtuple
    from pathlib import Path

    from components.release.publish import PublishSettings, publish
    from components.release.run_context import RunContext

    context = RunContext.of_task(repository, "", s3_endpoint=s3_endpoint, run_id=run_id)  # the folder's model
    result = publish(context, PublishSettings.from_dict(settings), folder=Path(compiled.path))
    return namedtuple("Published", ["version", "uri"])(result.version, result.uri)


@step("gate")
def calibrate_op(repository: str, model_name: str, gate: str, s3_endpoint: str, run_id: str, settings: dict) -> str:
    """With calibrate_rounds, each gate server's noise for the model (its stable version against itself), measured
    and recorded before the candidate is staged; the gate reads it. Returns the calibrations (JSON list)."""
    import json

    from components.release.gate.calibration import calibrate
    from components.release.run_context import RunContext
    from components.serving.replicas import resolve
    from components.settings import GateSettings

    chosen = GateSettings.from_dict(settings)
    context = RunContext.of_task(repository, model_name, s3_endpoint=s3_endpoint, run_id=run_id)
    if not chosen.calibrate_rounds or context.repo().desired_config(model_name)[0] is None:
        return "[]"  # off, or a first release: no stable version to measure
    found = [
        calibrate(context.on(server), chosen, rounds=chosen.calibrate_rounds).to_dict() for server in resolve(gate)
    ]
    for calibration in found:
        print(f"{calibration['gate']}: the gate decides limits of {calibration['decidable_pct']} % or more")
    return json.dumps(found)


@step("tools")
def stage_op(
    repository: str, model_name: str, version: int, gate: str, s3_endpoint: str, run_id: str, settings: dict
) -> str:
    """Load the candidate dark on the gate server; check its answers. Returns the stage result (JSON)."""
    from components.release.gate_turn import free_gate
    from components.release.run_context import RunContext
    from components.release.stage import ModelLoadSettings, stage
    from components.serving.replicas import resolve

    context = RunContext.of_task(repository, model_name, version, s3_endpoint=s3_endpoint, run_id=run_id)
    server = free_gate(context.repo(), resolve(gate))  # of several, measured there to the end
    return stage(context.on(server), ModelLoadSettings.from_dict(settings)).to_json()


@step("gate")
def tune_op(
    repository: str,
    model_name: str,
    version: int,
    gate: str,
    stage_result: str,
    s3_endpoint: str,
    run_id: str,
    settings: dict,
    report: Output[Markdown],
) -> str:
    """Search the candidate's serving settings on the gate (config overrides; S3 untouched). Returns the
    tuning result (JSON); turned off, or after a failed stage, it is the default settings, unmeasured."""
    import dataclasses
    import json
    from pathlib import Path

    from components.release.gate.report import tuning_markdown
    from components.release.gate_turn import staged_server
    from components.release.results import StageResult
    from components.release.run_context import RunContext
    from components.release.tune.settings import TuneSettings
    from components.release.tune.tune import tune

    staged = StageResult.from_json(stage_result)
    tuning = TuneSettings.from_dict(settings)  # at the gate's load, within its p99 limit (settings_op)
    tuning = dataclasses.replace(tuning, enabled=tuning.enabled and staged.accuracy_passed)
    server = staged_server(gate, staged)  # a k8s:// gate also gives its metrics endpoint: GPU/CPU figures per trial
    context = RunContext.of_task(repository, model_name, version, server, s3_endpoint=s3_endpoint, run_id=run_id)
    result = tune(context, tuning)
    text = result.to_json()
    Path(report.path).write_text("\n".join(tuning_markdown(json.loads(text))) if result.trials else "tuning was off\n")
    return text


@step("gate")
def quality_op(
    repository: str,
    model_name: str,
    version: int,
    gate: str,
    stage_result: str,
    s3_endpoint: str,
    run_id: str,
    settings: dict,
    metrics: Output[Metrics],
    report: Output[Markdown],
    report_html: Output[HTML],
) -> str:
    """Labelled rows through the candidate and stable on the gate; each metric's change judged against its limits.
    Returns the quality result (JSON), or "" when the release has no evaluation data or its staging failed; bad
    evaluation data or a bad spec fails the run (nothing is promoted, stable keeps serving)."""
    import re
    import tempfile
    from pathlib import Path

    from components.release.gate_turn import staged_server
    from components.release.quality import report as quality_report
    from components.release.quality.quality import quality
    from components.release.quality.spec import QualitySettings
    from components.release.results import StageResult
    from components.release.run_context import RunContext

    chosen, staged = QualitySettings.from_dict(settings), StageResult.from_json(stage_result)
    if not chosen.enabled or not staged.accuracy_passed:
        Path(report.path).write_text("# Quality: not run\n")
        Path(report_html.path).write_text("<p>Quality: not run</p>")
        return ""
    server = staged_server(gate, staged)  # the gate server it staged on
    context = RunContext.of_task(repository, model_name, version, server, s3_endpoint=s3_endpoint, run_id=run_id)
    result = quality(context, chosen)
    with tempfile.TemporaryDirectory() as tmp:
        quality_report.write(result, Path(tmp))
        Path(report.path).write_text((Path(tmp) / "quality.md").read_text())
        Path(report_html.path).write_text((Path(tmp) / "quality.html").read_text())
    for figures in result.metrics:  # the whole set's: candidate, stable and their difference, for the UI to compare
        if figures["slice"] or "problem" in figures:
            continue
        name = re.sub(r"[^A-Za-z0-9_]+", "_", figures["metric"]).strip("_")
        for key in ("candidate", "stable", "difference"):
            if figures.get(key) is not None:
                metrics.log_metric(f"{name}_{key}", round(figures[key], 6))
    metrics.log_metric("quality_rows", result.rows)
    metrics.log_metric("quality_passed", 1.0 if result.decision == "pass" else 0.0)
    print(quality_report.summary(result))
    return result.to_json()


# The outputs are PIPELINE_STEPS written out: KFP runs this function's source alone in the task's image, so its
# return annotation cannot read the list; tests/test_settings.py checks that they are the list's.
@step("tools")
def settings_op(parameters: dict, quality_spec: str = "") -> NamedTuple(
    "Steps",
    [
        ("export", dict),
        ("compile", dict),
        ("publish", dict),
        ("load", dict),
        ("tune", dict),
        ("quality", dict),
        ("gate", dict),
        ("promote", dict),
    ],
):
    """Every step's settings from the pipeline's parameters, checked before anything runs: a wrong one fails here,
    not after the GPU compile. Returns each task's own settings (PIPELINE_STEPS), so a task's inputs, and KFP's cache
    of it, change only with its own step's settings. The
    quality spec comes apart from `parameters`: KFP's local runner writes a pipeline parameter into a dict
    unescaped, so a spec's quotes or line breaks would break the task's input."""
    from collections import namedtuple

    from components.release.step_settings import PIPELINE_STEPS

    steps = PIPELINE_STEPS.settings({**parameters, "quality_spec": quality_spec})
    return namedtuple("Steps", list(steps))(**steps)


@step("gate")
def gate_op(
    repository: str,
    model_name: str,
    version: int,
    gate: str,
    stage_result: str,
    tuning_json: str,
    quality_json: str,
    s3_endpoint: str,
    run_id: str,
    settings: dict,
    metrics: Output[Metrics],
    report: Output[Markdown],
    report_html: Output[HTML],
) -> NamedTuple("Gated", [("verdict", str), ("verdict_json", str)]):
    """perf_analyzer rounds against stable until the limits decide, and the verdict; limits of 0 are off."""
    import tempfile
    from collections import namedtuple
    from pathlib import Path

    from components.release.gate.gate import gate as run_gate
    from components.release.gate_turn import staged_server
    from components.release.results import QualityResult, StageResult, TuneResult
    from components.release.run_context import RunContext
    from components.settings import GateSettings

    staged = StageResult.from_json(stage_result)
    with tempfile.TemporaryDirectory() as tmp:
        server = staged_server(gate, staged)  # with its metrics endpoint where `gate` names it: GPU/CPU figures
        context = RunContext.of_task(repository, model_name, version, server, s3_endpoint=s3_endpoint, run_id=run_id)
        result = run_gate(
            context,
            GateSettings.from_dict(settings),
            staged,
            Path(tmp),
            tuning=TuneResult.from_json(tuning_json),
            quality=QualityResult.from_json(quality_json) if quality_json else None,
        )
        Path(report.path).write_text((Path(tmp) / "report.md").read_text())
        Path(report_html.path).write_text((Path(tmp) / "report.html").read_text())
    for prefix, figures in (("candidate", result.candidate.summary()), ("stable", result.stable.summary())):
        for key, value in figures.items():
            if value is not None:
                metrics.log_metric(f"{prefix}_{key}", round(value, 4))
    for key in ("p99_regression_pct", "throughput_regression_pct", "measurement_seconds", "rounds"):
        if getattr(result, key) is not None:
            metrics.log_metric(key, round(getattr(result, key), 3))
    metrics.log_metric("passed", 1.0 if result.verdict == "pass" else 0.0)
    return namedtuple("Gated", ["verdict", "verdict_json"])(result.verdict, result.to_json())


@step("tools")
def promote_op(
    repository: str,
    model_name: str,
    version: int,
    replicas: str,
    gate: str,
    verdict_json: str,
    tuning_json: str,
    s3_endpoint: str,
    run_id: str,
    settings: dict,
    report: Output[Markdown],
    report_html: Output[HTML],
) -> NamedTuple("Promoted", [("promoted", bool), ("promote_json", str)]):
    """Rolling reload of every production replica with the tuned settings, the first ones measured as a canary
    on live traffic; a canary that reverts is an outcome (promoted false, its report), any other failure fails."""
    from collections import namedtuple
    from pathlib import Path

    from components.release.promote import canary_report
    from components.release.promote.promote import promote
    from components.release.promote.settings import PromoteSettings
    from components.release.results import TuneResult, Verdict
    from components.release.run_context import RunContext
    from components.serving.replicas import resolve

    decided = Verdict.from_json(verdict_json)
    server = resolve(decided.gate_url or gate)[0]  # the gate server it staged on, to unload the candidate from
    context = RunContext.of_task(repository, model_name, version, server, s3_endpoint=s3_endpoint, run_id=run_id)
    result = promote(
        context,
        PromoteSettings.from_dict(settings),
        replicas=resolve(replicas),
        verdict=decided.verdict,
        quality=decided.quality.decision if decided.quality else None,
        serving=TuneResult.from_json(tuning_json).chosen,
    )  # promoted, or reverted by the canary: an outcome; any other failure raises and fails the task
    for artifact, text in zip((report, report_html), canary_report.pages(result.canary), strict=True):
        Path(artifact.path).write_text(text)  # the CLI's --out report, its plot included
    if result.canary:
        print(canary_report.summary(result.canary))
    return namedtuple("Promoted", ["promoted", "promote_json"])(result.promoted, result.to_json())


@step("tools")
def reject_op(
    repository: str, model_name: str, version: int, gate: str, verdict_json: str, s3_endpoint: str, run_id: str
):
    """Leave production untouched, unload the candidate, record why."""
    from components.release.promote.promote import reject
    from components.release.results import Verdict
    from components.release.run_context import RunContext
    from components.serving.replicas import resolve

    decided = Verdict.from_json(verdict_json)
    server = resolve(decided.gate_url or gate)[0]  # the gate server it staged on, to unload the candidate from
    context = RunContext.of_task(repository, model_name, version, server, s3_endpoint=s3_endpoint, run_id=run_id)
    reject(context, decided.verdict, decided.reasons)


@step("tools")
def finish_release_op(repository: str, model_name: str, gate: str, replicas: str, s3_endpoint: str, run_id: str):
    """Exit handler: whatever happened, the candidate leaves the gate server, a promotion of this run that was
    killed (its pod past the grace period) is settled as `reconcile` does, and this run's release lease on the
    model is given back (promote and reject give it back themselves on their paths)."""
    from components.release.promote.reconcile import reconcile
    from components.release.promote.records import PromotionRecord
    from components.release.run_context import RunContext
    from components.release.stage import unload_candidate
    from components.serving.replicas import resolve

    context = RunContext.of_task(repository, model_name, s3_endpoint=s3_endpoint, run_id=run_id)
    for server in resolve(gate):  # of several gate servers, the one it staged on
        unload_candidate(server.url, context.model)
    repo = context.repo()
    killed = PromotionRecord.read(repo, context.model)
    if killed and killed.run_id == context.run_id:
        targets = resolve(replicas)
        for state in reconcile(context.repository, targets, [context.model], s3=context.s3, run_id=context.run_id):
            print(state.replica, state.model, state.action)
    repo.release_lease(context.model, context.lease_owner)  # the run id, in a pipeline run
