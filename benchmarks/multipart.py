"""Multipart upload (boto3 TransferConfig, as the repository uses) against one single-stream put_object.

    .venv/bin/python benchmarks/multipart.py [--size-mib 1024] [--repeats 3]

Runs against the embedded S3 server (moto) on loopback, so it measures the client side and the
server's ingestion on this machine, not a network. Prints a table and writes benchmarks/results/multipart.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from boto3.s3.transfer import TransferConfig

from components.repository import TRANSFER
from pipelines.stack import EmbeddedStack

MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, EmbeddedStack(replicas=0) as stack:
        path = Path(tmp) / "blob.bin"
        with open(path, "wb") as fh:
            for _ in range(args.size_mib):
                fh.write(bytes(range(256)) * 4096)
        client = stack.s3.client()
        configs = {
            "multipart 16 MiB x4 (ours)": TRANSFER,
            "multipart 64 MiB x8": TransferConfig(
                multipart_threshold=64 * MIB, multipart_chunksize=64 * MIB, max_concurrency=8
            ),
            "multipart 256 MiB x2": TransferConfig(
                multipart_threshold=256 * MIB, multipart_chunksize=256 * MIB, max_concurrency=2
            ),
        }
        timings: dict[str, list[float]] = {name: [] for name in configs} | {"single put_object": []}
        for i in range(args.repeats):
            for name, config in configs.items():
                started = time.perf_counter()
                client.upload_file(str(path), stack.bucket, f"mp/{i}", Config=config)
                timings[name].append(time.perf_counter() - started)
                client.delete_object(Bucket=stack.bucket, Key=f"mp/{i}")
            started = time.perf_counter()
            with open(path, "rb") as fh:
                client.put_object(Bucket=stack.bucket, Key=f"single/{i}", Body=fh)
            timings["single put_object"].append(time.perf_counter() - started)
            client.delete_object(Bucket=stack.bucket, Key=f"single/{i}")
    result = {
        "size_mib": args.size_mib,
        "repeats": args.repeats,
        "median_seconds": {k: statistics.median(v) for k, v in timings.items()},
        "all_seconds": timings,
    }
    single = result["median_seconds"]["single put_object"]
    print(f"{'method':<28} {'median s':>9} {'MiB/s':>8} {'speed-up':>9}")
    for method, seconds in result["median_seconds"].items():
        print(f"{method:<28} {seconds:>9.2f} {args.size_mib / seconds:>8.0f} {single / seconds:>8.2f}x")
    (Path(__file__).parent / "results" / "multipart.json").write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
