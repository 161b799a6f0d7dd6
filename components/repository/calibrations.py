"""Calibrations, each rewritten by the next:
- the gate's, root/calibration/<gate host_port>/<model>.json: the noise of an equal candidate as measured on that
  gate server for that model (components/release/gate/calibration.py). The gate reads it to say up front which
  limits its budget can decide there.
- the quality check's, root/calibration/quality/<model>.json: how much each metric moves between retrains of the
  model (components/release/quality/calibration.py). The quality step takes its limits for metrics without any."""

from __future__ import annotations

import json
from typing import Any

from components.repository.store import Store, gate_slug, utc_now


class Calibrations(Store):
    def _calibration_key(self, gate_url: str, model: str) -> str:
        return self._key("calibration", gate_slug(gate_url), f"{model}.json")

    def _write_record(self, key: str, record: dict[str, Any]) -> str:
        body = json.dumps({**record, "recorded": utc_now()}, sort_keys=True).encode()
        self._call(f"write s3://{self.bucket}/{key}", self.s3.put_object, Bucket=self.bucket, Key=key, Body=body)
        return f"s3://{self.bucket}/{key}"

    def write_calibration(self, gate_url: str, model: str, record: dict[str, Any]) -> str:
        """Record the model's calibration on a gate server; its S3 URI."""
        return self._write_record(self._calibration_key(gate_url, model), record)

    def write_quality_calibration(self, model: str, record: dict[str, Any]) -> str:
        """Record the model's retrain-to-retrain variation; its S3 URI."""
        return self._write_record(self._key("calibration", "quality", f"{model}.json"), record)

    def quality_calibration(self, model: str) -> dict[str, Any] | None:
        """The model's last quality calibration, or None."""
        body = self._get(self._key("calibration", "quality", f"{model}.json"))
        return json.loads(body) if body is not None else None

    def calibration(self, gate_url: str, model: str) -> dict[str, Any] | None:
        """The model's last calibration on a gate server, or None."""
        body = self._get(self._calibration_key(gate_url, model))
        return json.loads(body) if body is not None else None
