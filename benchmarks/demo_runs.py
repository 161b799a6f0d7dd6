"""Does the demo hold its story, run after run, quiet and beside a CPU-bound process?

    .venv/bin/python benchmarks/demo_runs.py --runs 3 --busy-runs 1 --out benchmarks/results/demo_runs.json

Each run is `tritonship demo` (five releases through the whole pipeline on the embedded stack, at the product's
default gate limits) in a work folder of its own; it exits 0 only when every release ended as its story says
(pipelines/demo.py story_differences). The last `--busy-runs` runs have `python3 -c 'while 1: pass'` beside them
for their whole length. Per run: the exit code, the minutes, the table the demo printed and, on a broken story,
the lines that say why. Results go into the JSON after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMIT_MINUTES = 10.0


def one_run(busy: bool) -> dict:
    spinner = subprocess.Popen([sys.executable, "-c", "while 1: pass"]) if busy else None
    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="tritonship-demo-run-") as workdir:
            done = subprocess.run(
                [str(ROOT / ".venv" / "bin" / "tritonship"), "demo", "--workdir", workdir],
                capture_output=True,
                text=True,
                cwd=ROOT,
                env={**os.environ, "COLUMNS": "200"},
            )
    finally:
        if spinner:
            spinner.kill()
            spinner.wait()
    minutes = (time.monotonic() - started) / 60
    lines = done.stdout.splitlines()
    return {
        "busy": busy,
        "exit_code": done.returncode,
        "held": done.returncode == 0 and minutes <= LIMIT_MINUTES,
        "minutes": round(minutes, 2),
        "table": [line for line in lines if line.startswith(("│", "┃", "v1", "v2", "v3", "v4", "v5"))],
        "broken": [line for line in lines if "did not end as its story says" in line] + done.stderr.splitlines()[-5:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument(
        "--busy-runs", type=int, default=1, help="of the runs, the last ones beside a CPU-bound process"
    )
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/demo_runs.json"))
    args = parser.parse_args()
    report: dict = {"command": " ".join(["python benchmarks/demo_runs.py", *sys.argv[1:]]), "runs": []}
    for index in range(args.runs):
        outcome = one_run(busy=index >= args.runs - args.busy_runs)
        report["runs"].append(outcome)
        print(
            f"run {index + 1}: {'held' if outcome['held'] else 'BROKEN'}, {outcome['minutes']} min, busy {outcome['busy']}"
        )
        args.out.write_text(json.dumps(report, indent=1))
    for busy in (False, True):
        runs = [r for r in report["runs"] if r["busy"] == busy]
        report["busy" if busy else "quiet"] = {
            "held": f"{sum(r['held'] for r in runs)} of {len(runs)}",
            "longest_minutes": max((r["minutes"] for r in runs), default=None),
        }
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("quiet", "busy")}))


if __name__ == "__main__":
    main()
