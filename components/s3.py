"""S3 access shared by the steps: settings, clients with retries, and the Triton form of a repository URI."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
)

from components.errors import TritonshipError


@dataclass(frozen=True)
class S3Settings:
    """Where S3 is and who we are there.

    Credentials left empty come from boto3's standard chain (environment, profile, IRSA web
    identity, instance metadata). The secret never appears in repr() or logs.
    """

    endpoint_url: str | None = None
    region: str = "us-east-1"
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    max_attempts: int = 5

    @classmethod
    def from_env(cls, endpoint_url: str | None = None) -> S3Settings:
        """Endpoint and region from the environment (or `endpoint_url`); credentials from boto3's chain."""
        return cls(
            endpoint_url=endpoint_url
            or os.environ.get("AWS_ENDPOINT_URL_S3")
            or os.environ.get("AWS_ENDPOINT_URL")
            or None,
            region=os.environ.get("AWS_DEFAULT_REGION") or os.environ.get("AWS_REGION") or "us-east-1",
        )

    def client(self):  # -> S3Client (boto3 stubs are not a dependency)
        config = Config(
            region_name=self.region,
            retries={"mode": "standard", "max_attempts": self.max_attempts},
            connect_timeout=5,
            read_timeout=60,
            s3={"addressing_style": "path"} if self.endpoint_url else None,
        )
        return boto3.session.Session(
            aws_access_key_id=self.access_key_id,
            aws_secret_access_key=self.secret_access_key,
            region_name=self.region,
        ).client("s3", endpoint_url=self.endpoint_url, config=config)

    def env(self) -> dict[str, str]:
        """The environment a tritonserver (or a step in a subprocess) needs to reach this S3."""
        env = {"AWS_DEFAULT_REGION": self.region, "AWS_REGION": self.region}
        if self.access_key_id and self.secret_access_key:
            env["AWS_ACCESS_KEY_ID"] = self.access_key_id
            env["AWS_SECRET_ACCESS_KEY"] = self.secret_access_key
        if self.endpoint_url:
            env["AWS_ENDPOINT_URL_S3"] = self.endpoint_url
        return env

    def triton_uri(self, bucket: str, prefix: str) -> str:
        """Triton's form: s3://bucket/prefix on AWS, s3://http://host:port/bucket/prefix elsewhere."""
        prefix = prefix.strip("/")
        if self.endpoint_url:
            return f"s3://{self.endpoint_url.rstrip('/')}/{bucket}/{prefix}"
        return f"s3://{bucket}/{prefix}"


class S3Error(TritonshipError):
    """S3 refused or could not be reached."""


def split_s3_uri(uri: str) -> tuple[str, str]:
    """'s3://bucket/some/prefix' -> ('bucket', 'some/prefix')."""
    if not uri.startswith("s3://") or not uri[5:].split("/", 1)[0]:
        raise TritonshipError(f"{uri!r} is not an S3 URI; write it as s3://bucket/prefix.")
    bucket, _, key = uri[5:].partition("/")
    return bucket, key.strip("/")


def explain(exc: Exception, what: str, bucket: str) -> S3Error:
    """One plain sentence for an S3 failure, never including credentials."""
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if code in ("NoSuchBucket",) or (code == "404" and not what.startswith("read")):
            return S3Error(f"the bucket '{bucket}' does not exist ({what}); create it or fix the repository URI.")
        if code in ("AccessDenied", "403", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken"):
            return S3Error(f"S3 denied access to bucket '{bucket}' ({what}: {code}); check the credentials and policy.")
        return S3Error(f"S3 refused to {what} in bucket '{bucket}': {code or status}.")
    if isinstance(exc, EndpointConnectionError | ConnectTimeoutError | ReadTimeoutError):
        return S3Error(f"S3 could not be reached to {what} ({type(exc).__name__}); check the endpoint URL and network.")
    if isinstance(exc, NoCredentialsError):
        return S3Error("no S3 credentials were found; set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, a profile or IRSA.")
    return S3Error(f"S3 failed to {what} in bucket '{bucket}': {type(exc).__name__}.")


S3_EXCEPTIONS = (ClientError, BotoCoreError)


def download_file(settings: S3Settings, bucket: str, key: str, path: Path) -> None:
    try:
        settings.client().download_file(bucket, key, str(path))
    except S3_EXCEPTIONS as exc:
        if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey"):
            raise S3Error(f"s3://{bucket}/{key} does not exist.") from None
        raise explain(exc, f"read s3://{bucket}/{key}", bucket) from None
