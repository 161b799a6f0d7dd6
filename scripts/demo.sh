#!/usr/bin/env bash
# Set up (if needed) and run the demo on the embedded stack; with --containers, every pipeline task runs in the
# project's images, which setup builds here.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ " $* " == *" --containers "* ]]; then bash scripts/setup.sh --containers; else bash scripts/setup.sh; fi
exec .venv/bin/tritonship demo "$@"
