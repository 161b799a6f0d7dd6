"""What a promotion is asked to do (read from S3 once before it starts) and what it changed, which a revert undoes."""

from __future__ import annotations

from dataclasses import dataclass, field

from components.model import model_config
from components.release.promote.rollout import Release
from components.release.run_context import RunContext
from components.release.stage import CandidateVersion, read_candidate
from components.repository import ModelRepository
from components.serving.replicas import Replica


@dataclass(frozen=True)
class Plan:
    """What a promotion is asked to do, read from S3 once before it starts."""

    repo: ModelRepository
    candidate: CandidateVersion
    replicas: list[Replica]
    previous: model_config.ModelConfig | None  # the desired state it replaces; None before a first release
    etag: str | None  # the roll replaces that desired state only if no one else did meanwhile
    run_id: str = ""
    serving: model_config.ServingSettings | None = None

    @classmethod
    def read(
        cls,
        repo: ModelRepository,
        context: RunContext,
        replicas: list[Replica],
        serving: model_config.ServingSettings | None = None,
    ) -> Plan:
        """The context's candidate and the desired state it replaces, from `repo` (the context's, opened once)."""
        previous, etag = repo.desired_config(context.model)
        candidate = read_candidate(repo, context.model, context.version)
        return cls(repo, candidate, replicas, previous, etag, context.run_id, serving)

    @property
    def model(self) -> str:
        return self.candidate.model

    @property
    def version(self) -> int:
        return self.candidate.version

    @property
    def previous_version(self) -> int | None:
        return self.previous.version_policy.specific.versions[0] if self.previous else None


@dataclass
class Changes:
    """What a promotion changed after its copy, which a revert undoes."""

    release: Release
    switched: int = 0  # the first `switched` replicas serve the new version
    desired_etags: dict[str, str] = field(default_factory=dict)  # the desired configs written, to put back
    member_previous: dict[str, model_config.ModelConfig | None] = field(default_factory=dict)
