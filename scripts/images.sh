#!/usr/bin/env bash
# Build and push the images of images/versions.yaml with docker buildx (needs a Docker engine).
set -euo pipefail
cd "$(dirname "$0")/.."
if ! docker info >/dev/null 2>&1; then
  echo "images: no Docker engine here; the Dockerfiles are checked statically by tests/test_images.py" >&2
  exit 1
fi
for kind in compile gate tools; do
  tag=$(.venv/bin/python -c "from pipelines.images import image; print(image('$kind'))")
  docker buildx build --platform linux/amd64 -f "images/$kind.Dockerfile" -t "$tag" --push .
done
