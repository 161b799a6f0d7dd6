"""The history: append-only events, one object each, never a read-modify-write."""

from __future__ import annotations

import json
import uuid
from typing import Any

from components.repository.store import Store, utc_now


class History(Store):
    def record(self, model: str, event: str, version: int | None = None, run_id: str = "", **details: Any) -> str:
        """Append one event: its own object, never a read-modify-write."""
        now = utc_now()
        stamp = now.replace("-", "").replace(":", "")
        key = self._key("history", model, f"{stamp}-{uuid.uuid4().hex[:8]}-{event}.json")
        body = {"time": now, "model": model, "event": event, "version": version, "run_id": run_id, **details}
        self._put_new(key, json.dumps(body, sort_keys=True, default=str).encode())
        return key

    def history(self, model: str) -> list[dict[str, Any]]:
        prefix = self._key("history", model) + "/"
        keys = sorted(e["Key"] for e in self._list(prefix) if "Key" in e)
        return [json.loads(self._get(k) or b"{}") for k in keys]
