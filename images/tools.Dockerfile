# Export, publish, stage, promote, reject: the project on slim Python with CPU torch (export runs the model) and
# transformers (the samples extra), which the users' BERT4Rec is built on.
FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 \
    TRITONSHIP_IMAGE=ghcr.io/tritonship/tools:0.1.0
WORKDIR /opt/tritonship
COPY pyproject.toml README.md ./
COPY components ./components
COPY pipelines ./pipelines
COPY images/versions.yaml ./images/versions.yaml
RUN pip install "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu \
 && pip install ".[pipeline,report,samples]" \
 && useradd --create-home --uid 10001 tritonship
USER 10001
