"""The desired state: production's config.pbtxt per model, pinned to the served version, replaced only if it
is still the one read (ETag)."""

from __future__ import annotations

from components.model.model_config import ModelConfig, parse_pbtxt, to_pbtxt
from components.repository.store import CONFIG, PRODUCTION, Store


class DesiredState(Store):
    def desired_config(self, model: str) -> tuple[ModelConfig | None, str | None]:
        """The production config.pbtxt (desired state) and its ETag, or (None, None) before the first release."""
        key = self._key(PRODUCTION, model, CONFIG)
        body, etag = self._get_with_etag(key)
        if body is None:
            return None, None
        return parse_pbtxt(body.decode(), f"s3://{self.bucket}/{key}"), etag

    def write_desired_config(self, model: str, config: ModelConfig, expected_etag: str | None) -> str:
        """Replace config.pbtxt atomically, only if it is still the one read (ETag), or create it if none was."""
        key = self._key(PRODUCTION, model, CONFIG)
        condition = {"IfMatch": expected_etag} if expected_etag else {"IfNoneMatch": "*"}
        response = self._call(
            f"write s3://{self.bucket}/{key}",
            self.s3.put_object,
            Bucket=self.bucket,
            Key=key,
            Body=to_pbtxt(config).encode(),
            **condition,
        )
        return response["ETag"]

    def delete_desired_config(self, model: str) -> None:
        """Back to "never released": production servers will not load the model after a restart."""
        self._call(
            "delete the desired config",
            self.s3.delete_object,
            Bucket=self.bucket,
            Key=self._key(PRODUCTION, model, CONFIG),
        )
