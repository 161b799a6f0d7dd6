"""Least-privilege S3 on the embedded stack: moto with IAM enforcement and one IAM user per principal, each
holding the policy a cluster would give it (manifests/iam/, the same JSON for IAM users or IRSA roles):

    production Tritons   read <root>/models/                     production-read.json
    the gate Triton      read <root>/models/ and <root>/staging/  gate-read.json
    the pipeline steps   read and write the repository           pipeline-readwrite.json

moto (5.x) enforces actions and resources, not conditions (the `s3:prefix` of a ListBucket is not checked),
and not the keys of a multi-object delete; what the tests rely on is checked by the tests. It also names
HeadBucket's action `s3:HeadBucket` (AWS authorises it with `s3:ListBucket`; Triton's S3 client calls it on
every load), and checks a multi-object delete as `s3:DeleteObject` on the bucket before it checks each key.
`create` adds those moto-only statements (MOTO_ONLY); the files in manifests/ stay as AWS reads them."""

from __future__ import annotations

import json
import string
from pathlib import Path

import boto3
import requests

from components.s3 import S3Settings

POLICIES = Path(__file__).resolve().parents[1] / "manifests" / "iam"
PRINCIPALS = {"pipeline": "pipeline-readwrite.json", "gate": "gate-read.json", "production": "production-read.json"}
MOTO_ONLY = {
    "pipeline": ["s3:HeadBucket", "s3:DeleteObject"],
    "gate": ["s3:HeadBucket"],
    "production": ["s3:HeadBucket"],
}


def policy_document(principal: str, bucket: str, prefix: str = "") -> str:
    """The principal's policy for the repository s3://bucket/prefix (prefix '' or ending in '/')."""
    template = string.Template((POLICIES / PRINCIPALS[principal]).read_text())
    return template.substitute(bucket=bucket, prefix=prefix)


def create(setup: S3Settings, bucket: str) -> dict[str, S3Settings]:
    """One IAM user per principal with its policy and an access key; call before `enforce`."""
    iam = boto3.client(
        "iam",
        endpoint_url=setup.endpoint_url,
        region_name=setup.region,
        aws_access_key_id=setup.access_key_id,
        aws_secret_access_key=setup.secret_access_key,
    )
    principals = {}
    for principal in PRINCIPALS:
        user = f"tritonship-{principal}"
        iam.create_user(UserName=user)
        document = json.loads(policy_document(principal, bucket))
        document["Statement"].append(
            {"Effect": "Allow", "Action": MOTO_ONLY[principal], "Resource": f"arn:aws:s3:::{bucket}"}
        )
        iam.put_user_policy(UserName=user, PolicyName=user, PolicyDocument=json.dumps(document))
        key = iam.create_access_key(UserName=user)["AccessKey"]
        principals[principal] = S3Settings(
            setup.endpoint_url, setup.region, key["AccessKeyId"], key["SecretAccessKey"], setup.max_attempts
        )
    return principals


def enforce(moto_url: str) -> None:
    """From now on the moto server authenticates and authorises every request (INITIAL_NO_AUTH_ACTION_COUNT 0)."""
    requests.post(f"{moto_url}/moto-api/reset-auth", data=b"0", timeout=10).raise_for_status()
