"""Stage step: load the candidate DARK on the gate server and check its answers against the golden outputs.

The candidate is loaded from the staging prefix under its own name (`<model>__candidate`), which only
the gate server mounts, so no production server can route a request to it. The load uses a config
override pinned to the candidate version: the staging folder needs no config.pbtxt of its own.
"""

from __future__ import annotations

import io
import time
from dataclasses import asdict, dataclass, field
from typing import Annotated

import numpy as np

from components import log
from components.errors import TritonshipError
from components.model import ensemble, model_config
from components.model.parity import OutputParity, Tolerance, compare, parity_table
from components.model.signature import Signature
from components.release.results import StageResult
from components.release.run_context import RunContext
from components.repository import ModelRepository, candidate_name
from components.serving.triton_admin import TritonAdmin, TritonError, TritonUnreachable
from components.settings import DEFAULT_LOAD_TIMEOUT_S
from components.settings_model import StepSettings, setting, step_settings

LOG = log.get("stage")


@step_settings("load")
class ModelLoadSettings(StepSettings):
    """stage's and promote's: how long a server may take to load the candidate."""

    load_timeout_s: Annotated[float, setting("seconds one model load may take on a server before it fails", gt=0)] = (
        DEFAULT_LOAD_TIMEOUT_S
    )


class StageError(TritonshipError):
    """The candidate could not be staged."""


@dataclass(frozen=True)
class CandidateVersion:
    """What the gate and promotion need to know about a staged version, read once from S3."""

    model: str
    version: int
    config: model_config.ModelConfig  # the version's own config.pbtxt (production name)
    signature: Signature
    golden_inputs: dict[str, np.ndarray]
    golden_outputs: dict[str, np.ndarray]
    tolerance: Tolerance
    members: dict[str, model_config.ModelConfig] = field(default_factory=dict)  # an ensemble's, in step order

    @property
    def output_names(self) -> list[str]:
        return [s.name for s in self.signature.outputs]

    @property
    def request_shapes(self) -> dict[str, list[int]]:
        """The shape of each input of one measured request: one golden sample (made at every dynamic
        dimension's opt), without the batch."""
        batched = self.config.max_batch_size > 0
        return {k: list(v.shape[1:] if batched else v.shape) for k, v in self.golden_inputs.items()}

    def candidate_config(self) -> model_config.ModelConfig:
        """Dark on the gate: `<model>__candidate`; an ensemble's steps run the members' candidates."""
        config = model_config.pin_version(model_config.renamed(self.config, candidate_name(self.model)), self.version)
        if self.members:
            config = ensemble.pin_members(config, self.version, candidate_name)
        return config

    def member_candidate_configs(self) -> list[model_config.ModelConfig]:
        return [
            model_config.pin_version(model_config.renamed(c, candidate_name(name)), self.version)
            for name, c in self.members.items()
        ]

    def production_configs(self) -> dict[str, model_config.ModelConfig]:
        """Each member's and then the entry point's config pinned to this version, production names."""
        configs = {name: model_config.pin_version(c, self.version) for name, c in self.members.items()}
        configs[self.model] = model_config.pin_version(self.config, self.version)
        return configs


def read_candidate(repo: ModelRepository, model: str, version: int) -> CandidateVersion:
    manifest = repo.manifest(model, version, staged=True)
    if manifest is None:
        raise StageError(
            f"version {version} of '{model}' is not published in {repo.staging_uri()} (no manifest); check --model "
            "and --version against `tritonship repo ls`, or publish it first."
        )
    config = model_config.parse_pbtxt(repo.read_version_file(model, version, True, "config.pbtxt").decode())
    with np.load(io.BytesIO(repo.read_version_file(model, version, True, manifest.golden)), allow_pickle=False) as data:
        inputs = {k[3:]: data[k] for k in data.files if k.startswith("in:")}
        outputs = {k[4:]: data[k] for k in data.files if k.startswith("out:")}
    tolerance_fields = manifest.fingerprint.get("tolerance")
    tolerance = Tolerance(**tolerance_fields) if tolerance_fields else Tolerance.for_precision("fp32")
    signature = Signature.from_dict(manifest.signature)
    members = {
        name: model_config.parse_pbtxt(repo.read_version_file(name, member_version, True, "config.pbtxt").decode())
        for name, member_version in manifest.members.items()
    }
    return CandidateVersion(model, version, config, signature, inputs, outputs, tolerance, members)


def served_accuracy(
    admin: TritonAdmin,
    name: str,
    candidate: CandidateVersion,
    version: int | str = "",
    max_batch_size: int | None = None,
) -> list[OutputParity]:
    """Send the golden inputs to `name` on a server and compare its answers with the golden outputs, in
    requests no larger than the served config's max_batch_size (tuning may have lowered it)."""
    batch = candidate.config.max_batch_size if max_batch_size is None else max_batch_size
    answer = admin.infer_in_batches(name, candidate.golden_inputs, candidate.output_names, batch, version)
    return [
        compare(n, answer[n], candidate.golden_outputs[n], candidate.tolerance, "served")
        for n in candidate.output_names
    ]


def load_candidate(admin: TritonAdmin, candidate: CandidateVersion) -> None:
    """Load the candidate dark on the gate server under its own name, an ensemble's members first. Raises
    TritonError."""
    for member in candidate.member_candidate_configs():
        admin.load(member.name, member)
        admin.wait_ready(member.name, candidate.version)
    admin.load(candidate_name(candidate.model), candidate.candidate_config())
    admin.wait_ready(candidate_name(candidate.model), candidate.version)


def load_stable(admin: TritonAdmin, repo: ModelRepository, model: str, desired: model_config.ModelConfig) -> float:
    """Load the stable version (an ensemble's stable members first) on the gate beside the candidate, as
    production's desired state has it; the seconds it took. Raises TritonError."""
    loading = time.monotonic()
    for member in ensemble.member_names(desired):
        member_config, _ = repo.desired_config(member)
        admin.load(member, member_config)
        admin.wait_ready(member, ensemble.pinned_member_version(desired))
    admin.load(model, desired)
    admin.wait_ready(model, desired.version_policy.specific.versions[0])
    return time.monotonic() - loading


def stage(context: RunContext, settings: ModelLoadSettings | None = None) -> StageResult:
    """Load the context's candidate dark on its gate server, under the model's release lease, and compare its
    answers with the golden outputs; the load may take `settings.load_timeout_s`."""
    settings = settings or ModelLoadSettings()
    model, version, run_id = context.model, context.version, context.run_id
    repo = context.repo()
    candidate = read_candidate(repo, model, version)
    repo.acquire_lease(model, context.lease_owner)  # one release of a model at a time
    name = candidate_name(model)
    load_error, accuracy = "", []
    with TritonAdmin(context.gate_url, load_timeout=settings.load_timeout_s) as gate:
        gate.ensure_live()  # an unreachable gate is an error of the step, not a verdict on the model
        started = time.monotonic()
        try:
            load_candidate(gate, candidate)
        except TritonUnreachable:
            load_error = _went_down(gate, "loading")
        except TritonError as exc:
            load_error = _load_error(gate, name, repo, exc)
            for member in candidate.member_candidate_configs():  # nothing half-staged stays on the gate
                if gate.is_ready(member.name):
                    gate.unload(member.name)
        load_seconds = time.monotonic() - started
        if not load_error:
            try:
                accuracy = served_accuracy(gate, name, candidate, version)
            except TritonUnreachable:
                load_error = _went_down(gate, "answering")
    passed = not load_error and all(r.passed for r in accuracy)
    result = StageResult(model, version, name, gate.url, passed, accuracy, round(load_seconds, 3), load_error)
    repo.record(
        model,
        "staged",
        version,
        run_id,
        gate=gate.url,
        accuracy_passed=passed,
        accuracy=[asdict(r) for r in accuracy],
        load_error=load_error,
    )
    log.event(LOG, "staged", model=model, version=version, gate=gate.url, accuracy_passed=passed)
    if load_error:
        log.event(LOG, "the gate server could not load the candidate", error=load_error)  # the result says it
    elif not passed:
        log.event(LOG, "accuracy check failed", level=30, table="\n" + parity_table(accuracy))
    return result


def _went_down(gate: TritonAdmin, doing: str) -> str:
    """The candidate took the gate server down (or it stopped answering): the step's result, not its error."""
    try:
        gate.ensure_live()
    except TritonUnreachable:
        return (
            f"the gate server {gate.url} went down while {doing} the candidate: Triton's PyTorch backend runs inside "
            "the server's process, so a model that crashes libtorch takes the server with it; production is "
            "untouched, and the gate server serves again once restarted (the Helm chart's pod restarts by itself; "
            "an embedded stack: `tritonship stack down` and `tritonship stack up`)"
        )
    raise TritonUnreachable(
        f"the gate server {gate.url} stopped answering while {doing} the candidate but is live; try again."
    )


def server_reason(message: str) -> str:
    """The server's own reason in one sentence: libtorch's errors run on over many lines of advice and frames."""
    first = message.strip().splitlines()[0] if message.strip() else message
    first = first.rsplit("Internal: ", 1)[-1]  # Triton's "load failed … UNAVAILABLE state: Internal: " prefix
    sentence = first.split(". ", 1)[0].rstrip(".")
    return sentence[:400]


def _load_error(gate: TritonAdmin, name: str, repo: ModelRepository, exc: TritonError) -> str:
    """Why the load failed, in the server's own words; when the gate does not see the candidate at all, what
    it does see."""
    try:
        listed = sorted({entry["name"] for entry in gate.repository_index()})
    except TritonError:
        return str(exc)
    if name in listed:
        return f"Triton at {gate.url} refused to load {name}: {server_reason(str(exc))}"
    shown = ", ".join(listed[:12]) + (f" and {len(listed) - 12} more" if len(listed) > 12 else "") or "nothing"
    return (
        f"the gate server {gate.url} does not see {name} in its model repositories (it lists {shown}): start it "
        f"with --model-repository={repo.staging_uri()}, where the candidate was published ({exc})"
    )


def unload_candidate(gate_url: str, model: str) -> bool:
    """Unload `<model>__candidate` from the gate server; False if it was not loaded or the gate is gone."""
    name = candidate_name(model)
    with TritonAdmin(gate_url, timeout=10, retries=1) as gate:
        try:
            if not gate.is_ready(name):
                return False
            gate.unload_with_members(name)  # an ensemble's candidate members too
            return True
        except TritonshipError as exc:
            log.event(LOG, "candidate not unloaded", gate=gate_url, reason=str(exc), level=30)
            return False
