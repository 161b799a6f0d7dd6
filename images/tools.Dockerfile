# Export, publish, stage, promote, reject: the project on slim Python with CPU torch (export runs the model) and
# transformers (the samples extra), which the users' BERT4Rec is built on.
# BASE and TORCH come from images/versions.yaml (make images); the defaults are checked against it.
ARG BASE=python:3.11.11-slim-bookworm
FROM ${BASE}
ARG IMAGE=ghcr.io/tritonship/tools:0.1.0
ARG TORCH=2.13.0
# Empty: the build's own pip configuration finds torch (make images-local, as setup.sh does for .venv).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRITONSHIP_IMAGE=${IMAGE}
WORKDIR /opt/tritonship
# The dependencies first, then the code: a change to the code rebuilds only the last layers.
RUN pip install "torch==${TORCH}" --index-url "${TORCH_INDEX:-$(pip config get global.index-url 2>/dev/null || echo https://pypi.org/simple)}" \
 && useradd --create-home --uid 10001 tritonship
COPY pyproject.toml ./
RUN python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
print("\n".join(p["dependencies"] + [r for e in ("pipeline", "report", "samples") for r in p["optional-dependencies"][e]]))' \
    > /tmp/requirements.txt \
 && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY README.md ./
COPY components ./components
COPY pipelines ./pipelines
COPY images/versions.yaml ./images/versions.yaml
RUN pip install --no-deps .
USER 10001
