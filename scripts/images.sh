#!/usr/bin/env bash
# Build the images of images/versions.yaml (pipelines/image_build.py): from their NGC and Docker Hub bases with
# docker buildx or podman, or with --local on a Debian base made here (podman), where those cannot be pulled.
# --push pushes each image after it is built.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ " $* " == *" --local "* ]]; then bash scripts/setup.sh --containers >/dev/null; else bash scripts/setup.sh >/dev/null; fi
exec .venv/bin/tritonship images build "$@"
