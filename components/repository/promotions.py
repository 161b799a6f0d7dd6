"""The promotion-in-progress record: root/promotions/<model>.json, written when promote starts, rewritten at
each of its phases and deleted when it ends. A run that died (SIGKILL, a lost node, a pod past its grace
period) leaves it behind, and `reconcile` or the pipeline's exit handler settles it (docs/design.md
section 3). Only the holder of the model's release lease writes it. Its keys are `PromotionRecord`'s
(components/release/promote/records.py), which writes and reads it; this store adds `model` and `updated`."""

from __future__ import annotations

import json
from typing import Any

from components.repository.store import Store, utc_now


class Promotions(Store):
    def _promotion_key(self, model: str) -> str:
        return self._key("promotions", f"{model}.json")

    def write_promotion(self, model: str, record: dict[str, Any]) -> None:
        """Record (or update) the model's promotion in progress: run, versions, phase."""
        body = json.dumps({**record, "model": model, "updated": utc_now()}, sort_keys=True).encode()
        key = self._promotion_key(model)
        self._call(f"write s3://{self.bucket}/{key}", self.s3.put_object, Bucket=self.bucket, Key=key, Body=body)

    def promotion(self, model: str) -> dict[str, Any] | None:
        """The model's promotion in progress, or None."""
        body = self._get(self._promotion_key(model))
        return json.loads(body) if body is not None else None

    def promotion_models(self) -> list[str]:
        """The models with a promotion in progress (or killed before it ended)."""
        prefix = self._key("promotions") + "/"
        return sorted(e["Key"][len(prefix) : -len(".json")] for e in self._list(prefix) if "Key" in e)

    def clear_promotion(self, model: str) -> None:
        key = self._promotion_key(model)
        self._call(f"delete s3://{self.bucket}/{key}", self.s3.delete_object, Bucket=self.bucket, Key=key)
