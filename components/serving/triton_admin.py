"""Triton administration over tritonclient's HTTP API: load (with a config override), unload, readiness,
repository index, statistics and inference, with time limits, retries and errors a person can act on."""

from __future__ import annotations

import http.client
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from components import log
from components.errors import TritonshipError
from components.model.model_config import AOTI_PLATFORM, ModelConfig, to_json
from components.serving import admin_key

LOG = log.get("triton")
T = TypeVar("T")
# The backend a Triton older than r26.03 serves `torch_aoti` with, when it has one (the embedded stack's 2.51:
# docs/design.md section 5); unset, a torch_aoti config goes as published and the server picks its backend.
AOTI_BACKEND_ENV = "TRITONSHIP_TORCH_AOTI_BACKEND"


def for_server(config: ModelConfig) -> ModelConfig:
    """`config` as this environment's Triton takes it: a torch_aoti config names AOTI_BACKEND_ENV's backend."""
    backend = os.environ.get(AOTI_BACKEND_ENV)
    if not backend or config.platform != AOTI_PLATFORM or config.backend:
        return config
    named = ModelConfig()
    named.CopyFrom(config)
    named.backend = backend
    return named


class TritonError(TritonshipError):
    """A Triton server refused a request or could not be reached."""


class TritonUnreachable(TritonError):
    """No answer from the server at all (connection refused, timeout)."""


def _normalise(url: str) -> str:
    return url.removeprefix("http://").removeprefix("https://").rstrip("/")


class TritonAdmin:
    """One Triton server's HTTP endpoint (host:port). Admin calls carry the admin key (components/serving/admin_key.py,
    from the environment unless given): load, unload, the repository index and model configs."""

    def __init__(
        self, url: str, timeout: float = 30.0, load_timeout: float = 300.0, retries: int = 3, key: str | None = None
    ) -> None:
        self.url = _normalise(url)
        self.timeout = timeout
        self.retries = retries
        key = key if key is not None else admin_key.from_env()
        self._admin = {admin_key.HEADER: key} if key else None
        self._client = httpclient.InferenceServerClient(self.url, connection_timeout=timeout, network_timeout=timeout)
        # Loads download the model from S3 and initialise it: a separate, longer limit.
        self._load_client = httpclient.InferenceServerClient(
            self.url, connection_timeout=timeout, network_timeout=load_timeout
        )

    def close(self) -> None:
        self._client.close()
        self._load_client.close()

    def __enter__(self) -> TritonAdmin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TritonAdmin({self.url})"

    # ------------------------------------------------------------------------------------ health
    def is_live(self) -> bool:
        try:
            return bool(self._client.is_server_live())
        except Exception:
            return False

    def ensure_live(self) -> None:
        self._call("check the server is live", self._client.is_server_live, retry=True)

    # ------------------------------------------------------------------------- model control
    def load(self, model: str, config: ModelConfig | None = None, files: Mapping[str, bytes] | None = None) -> None:
        """Load (or reload) `model`; with `config`, Triton uses it instead of the repository's config.pbtxt."""
        log.event(LOG, "load", server=self.url, model=model, versions=_versions(config))
        self._call(
            f"load model '{model}'",
            lambda: self._load_client.load_model(
                model,
                headers=self._admin,
                config=to_json(for_server(config)) if config is not None else None,
                files=dict(files) if files else None,
            ),
            retry=False,
        )

    def unload(self, model: str, unload_dependents: bool = False) -> None:
        log.event(LOG, "unload", server=self.url, model=model)
        self._call(
            f"unload model '{model}'",
            lambda: self._client.unload_model(model, headers=self._admin, unload_dependents=unload_dependents),
        )

    def unload_with_members(self, model: str) -> None:
        """Unload `model` and, for an ensemble, then its step models (which were loaded explicitly, so
        Triton's unload_dependents leaves them). The members are read from the served config, not S3."""
        steps = self.model_config(model).get("ensemble_scheduling", {}).get("step", [])
        self.unload(model)
        for step in steps:
            self.unload(step["model_name"])

    def reload_ensemble(
        self,
        model: str,
        config: ModelConfig,
        members: Mapping[str, ModelConfig],
        version: int | str = "",
        files: Mapping[str, Mapping[str, bytes]] | None = None,
    ) -> None:
        """Reload an ensemble with new member configs: the ensemble is unloaded first (a member's
        max_batch_size may drop below the ensemble's, which Triton refuses while the ensemble is loaded),
        then each member is loaded (with its `files`, if any) and waited for, then the ensemble."""
        self.unload(model)
        for name, member in members.items():
            self.load(name, member, (files or {}).get(name))
            self.wait_ready(name, version)
        self.load(model, config)
        self.wait_ready(model, version)

    def is_ready(self, model: str, version: int | str = "") -> bool:
        """False for a model (version) that is not ready; TritonUnreachable if the server does not answer."""
        try:
            return bool(self._call(f"check model '{model}'", lambda: self._client.is_model_ready(model, str(version))))
        except TritonUnreachable:
            raise
        except TritonError:
            return False

    def wait_ready(self, model: str, version: int | str = "", timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.is_ready(model, version):
                return
            time.sleep(0.2)
        raise TritonError(
            f"model '{model}' version {version or 'latest'} on {self.url} was not ready within {timeout:.0f} s."
        )

    def ready_models(self) -> dict[str, list[int]]:
        """Every model that is loaded and READY, with its READY versions. Read from the statistics, which Triton
        keeps for those alone: its repository index would list every model folder of the repository (in S3)."""
        found: dict[str, list[int]] = {}
        for entry in self.statistics().get("model_stats", []):
            found.setdefault(entry["name"], []).append(int(entry["version"]))
        return {name: sorted(versions) for name, versions in found.items()}

    def ready_versions(self, model: str) -> list[int]:
        """The versions of `model` that are loaded and READY."""
        return self.ready_models().get(model, [])

    def repository_index(self) -> list[dict[str, Any]]:
        return self._call(
            "read the repository index",
            lambda: self._client.get_model_repository_index(headers=self._admin),
            retry=True,
        )

    def statistics(self, model: str = "", version: int | str = "") -> dict[str, Any]:
        return self._call(
            f"read statistics of '{model}'",
            lambda: self._client.get_inference_statistics(model, str(version)),
            retry=True,
        )

    def model_config(self, model: str, version: int | str = "") -> dict[str, Any]:
        return self._call(
            f"read the config of '{model}'",
            lambda: self._client.get_model_config(model, str(version), headers=self._admin),
            retry=True,
        )

    # ------------------------------------------------------------------------------- inference
    def infer(
        self, model: str, inputs: Mapping[str, np.ndarray], output_names: list[str], version: int | str = ""
    ) -> dict[str, np.ndarray]:
        """One inference; returns the outputs by name. `version` '' lets Triton choose, as clients do."""
        result = self._infer(model, inputs, output_names, version)
        return {n: result.as_numpy(n) for n in output_names}

    def infer_in_batches(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        output_names: list[str],
        max_batch_size: int,
        version: int | str = "",
    ) -> dict[str, np.ndarray]:
        """Infer many samples in requests of at most `max_batch_size` (0: one request, unbatched model)."""
        total = len(next(iter(inputs.values())))
        if max_batch_size <= 0 or total <= max_batch_size:
            return self.infer(model, inputs, output_names, version)
        parts = [
            self.infer(model, {k: v[i : i + max_batch_size] for k, v in inputs.items()}, output_names, version)
            for i in range(0, total, max_batch_size)
        ]
        return {n: np.concatenate([p[n] for p in parts]) for n in output_names}

    def served_version(self, model: str, inputs: Mapping[str, np.ndarray], output_names: list[str]) -> int:
        """Which version answers an unversioned request (the response says)."""
        return self.served(model, inputs, output_names)[0]

    def served(
        self, model: str, inputs: Mapping[str, np.ndarray], output_names: list[str], after_load: bool = False
    ) -> tuple[int, dict[str, np.ndarray]]:
        """An unversioned request, as clients send it: the version that answered and its outputs.

        `after_load`: the first request to a model just loaded, which may wait the load's time limit. Its
        backends run their first inference (TorchScript optimises on its first calls; an ensemble starts
        every step), which on a busy 2-core machine took longer than the ordinary request limit."""
        result = self._infer(model, inputs, output_names, "", self._load_client if after_load else self._client)
        return int(result.get_response()["model_version"]), {n: result.as_numpy(n) for n in output_names}

    def _infer(
        self,
        model: str,
        inputs: Mapping[str, np.ndarray],
        output_names: list[str],
        version: int | str,
        client: httpclient.InferenceServerClient | None = None,
    ) -> httpclient.InferResult:
        tensors = []
        for name, array in inputs.items():
            tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
            tensor.set_data_from_numpy(array)
            tensors.append(tensor)
        requested = [httpclient.InferRequestedOutput(n) for n in output_names]
        return self._call(
            f"infer on '{model}'",
            lambda: (client or self._client).infer(model, tensors, model_version=str(version), outputs=requested),
        )

    # -------------------------------------------------------------------------------- internals
    def _call(self, what: str, fn: Callable[[], T], retry: bool = False) -> T:
        attempts = self.retries if retry else 1
        for attempt in range(1, attempts + 1):
            try:
                return fn()
            except InferenceServerException as exc:
                if _is_connection_error(exc):
                    if attempt < attempts:
                        time.sleep(0.5 * attempt)
                        continue
                    raise TritonUnreachable(self._unreachable(what)) from None
                raise TritonError(f"Triton at {self.url} could not {what}: {exc.message()}{self._hint(exc)}") from None
            except (OSError, http.client.HTTPException):  # HTTPException: the server closed the connection
                if attempt < attempts:
                    time.sleep(0.5 * attempt)
                    continue
                raise TritonUnreachable(self._unreachable(what)) from None
        raise AssertionError("unreachable")

    def _hint(self, exc: InferenceServerException) -> str:
        if "restricted" not in (exc.message() or "").lower() and str(exc.status()) != "403":
            return ""
        given = "the admin key given is not the server's" if self._admin else "no admin key was given"
        return f" ({given}; set {admin_key.ENV} or {admin_key.FILE_ENV} to the key the server was started with)"

    def _unreachable(self, what: str) -> str:
        return f"Triton at {self.url} did not answer (trying to {what}); check the URL and that the server is running."


def _versions(config: ModelConfig | None) -> str:
    if config is None or not config.version_policy.HasField("specific"):
        return "repository"
    return ",".join(str(v) for v in config.version_policy.specific.versions)


def _is_connection_error(exc: InferenceServerException) -> bool:
    text = (exc.message() or "").lower()
    return exc.status() is None and any(
        s in text for s in ("connection", "refused", "timed out", "timeout", "reset", "broken pipe", "unreachable")
    )
