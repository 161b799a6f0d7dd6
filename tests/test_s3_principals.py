"""Least-privilege S3, enforced: the embedded S3 checks every request against the policies of manifests/iam/
(pipelines/s3_principals.py). Production reads models/ only, the gate reads models/ and staging/, the pipeline
reads and writes. Every release test of the suite runs with these principals."""

from __future__ import annotations

import json

import pytest
from botocore.exceptions import ClientError

from pipelines.s3_principals import PRINCIPALS, policy_document


def _denied(call) -> bool:
    try:
        call()
    except ClientError as exc:
        return exc.response["ResponseMetadata"]["HTTPStatusCode"] == 403
    return False


@pytest.fixture(scope="module")
def objects(stack) -> dict[str, str]:
    pipeline = stack.principals["pipeline"].client()
    keys = {"models": "models/principals-test/1/file", "staging": "staging/principals-test/1/file"}
    for key in keys.values():
        pipeline.put_object(Bucket=stack.bucket, Key=key, Body=b"weights")  # the pipeline writes both
    yield keys
    for key in keys.values():
        pipeline.delete_object(Bucket=stack.bucket, Key=key)


@pytest.mark.parametrize("principal", ["production", "gate"])
def test_readers_cannot_write_or_delete_anywhere(stack, objects, principal):
    client = stack.principals[principal].client()
    for key in objects.values():
        assert _denied(lambda key=key: client.put_object(Bucket=stack.bucket, Key=key, Body=b"tampered"))
        assert _denied(lambda key=key: client.delete_object(Bucket=stack.bucket, Key=key))
        assert _denied(
            lambda key=key: client.copy_object(
                Bucket=stack.bucket, Key=key + ".copy", CopySource={"Bucket": stack.bucket, "Key": key}
            )
        )
    assert _denied(lambda: client.put_object(Bucket=stack.bucket, Key="leases/principals-test.json", Body=b"{}"))
    pipeline = stack.principals["pipeline"].client()
    assert [pipeline.get_object(Bucket=stack.bucket, Key=k)["Body"].read() for k in objects.values()] == [
        b"weights"
    ] * 2


def test_production_reads_models_only_and_the_gate_reads_models_and_staging(stack, objects):
    production, gate = stack.principals["production"].client(), stack.principals["gate"].client()
    assert production.get_object(Bucket=stack.bucket, Key=objects["models"])["Body"].read() == b"weights"
    assert _denied(lambda: production.get_object(Bucket=stack.bucket, Key=objects["staging"]))
    assert _denied(lambda: production.get_object(Bucket=stack.bucket, Key="history/anything.json"))
    for key in objects.values():
        assert gate.get_object(Bucket=stack.bucket, Key=key)["Body"].read() == b"weights"


def test_every_triton_of_the_stack_reads_s3_as_its_principal(stack):
    for server in stack.servers.values():
        principal = "gate" if server.name == "gate" else "production"
        assert server.process.env["AWS_ACCESS_KEY_ID"] == stack.principals[principal].access_key_id, server.name
    assert stack.s3.access_key_id == stack.principals["pipeline"].access_key_id  # the steps' own


@pytest.mark.parametrize("principal", PRINCIPALS)
def test_the_shipped_policies_are_valid_json_for_any_repository_root(principal):
    document = json.loads(policy_document(principal, "my-bucket", "teams/recs/"))
    resources = [
        r for s in document["Statement"] for r in ([s["Resource"]] if isinstance(s["Resource"], str) else s["Resource"])
    ]
    assert all(r.startswith("arn:aws:s3:::my-bucket") for r in resources)
    assert all(r == "arn:aws:s3:::my-bucket" or r.startswith("arn:aws:s3:::my-bucket/teams/recs/") for r in resources)
