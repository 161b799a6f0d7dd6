#!/usr/bin/env bash
# Set up (if needed), lint, and run the whole test suite against the real embedded stack.
# pytest's exit 5 (no tests collected) is a failure like any other non-zero exit.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --containers
.venv/bin/ruff check .
.venv/bin/ruff format --check . >/dev/null || { echo "ruff format would change files; run: .venv/bin/ruff format ."; exit 1; }
exec .venv/bin/pytest "$@"
