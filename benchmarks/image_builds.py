"""What the local images cost to build (images/versions.yaml `local`: podman on a debootstrap base), and what
they weigh.

    .venv/bin/python benchmarks/image_builds.py [--out benchmarks/results/image_builds.json]

Three builds in a row, each timed per image: from nothing (the local images and their base removed, and every image podman
holds that no container uses), from cache with nothing changed, and from cache after a change to the project's code (what
CI and a developer pay: the dependency layers are reused, the code layers are rebuilt). Run it on a quiet
machine: pip's downloads and the unpacking of torch dominate the first build.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipelines.image_build import ROOT, build_all
from pipelines.images import matrix

CODE_CHANGE = ROOT / "pipelines" / "_image_build_benchmark_change.py"


def remove_local_images() -> None:
    local = matrix()["local"]
    for tag in [*local["images"].values(), local["base"]]:
        subprocess.run(["podman", "rmi", "--force", tag], capture_output=True, check=False)
    subprocess.run(["podman", "image", "prune", "--all", "--force"], capture_output=True, check=False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/image_builds.json")
    args = parser.parse_args()
    results: dict[str, object] = {
        "command": "python benchmarks/image_builds.py",
        "machine": f"{platform.node()}: {platform.machine()}, {os.cpu_count()} cores",
        "podman": subprocess.run(["podman", "--version"], capture_output=True, text=True).stdout.strip(),
    }
    remove_local_images()
    for name in ("from_nothing", "from_cache", "after_a_code_change"):
        if name == "after_a_code_change":
            CODE_CHANGE.write_text(f"# a change to the code, {time.time()}\n")
        try:
            started = time.monotonic()
            results[name] = {"images": build_all(local=True), "total_seconds": round(time.monotonic() - started, 1)}
        finally:
            CODE_CHANGE.unlink(missing_ok=True)
        print(name, json.dumps(results[name]), flush=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
