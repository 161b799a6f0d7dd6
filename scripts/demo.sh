#!/usr/bin/env bash
# Set up (if needed) and run the demo on the embedded stack.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/tritonship demo "$@"
