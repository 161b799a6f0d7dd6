# The user's image for the pipeline's export task (and their training): the project's tools image plus the user's
# model package, a source folder or a wheel (tritonship images build --model-package; pipelines/image_build.py
# copies it into the build context as package/). Everything after export runs without it.
ARG BASE=ghcr.io/tritonship/tools:0.1.0
FROM ${BASE}
ARG IMAGE=localhost/model:0.1.0
USER 0
WORKDIR /tmp/model-package
COPY package ./
# a wheel is installed as it is, a source folder is built; what the tools image has (torch) is kept
RUN if ls ./*.whl >/dev/null 2>&1; then pip install --no-cache-dir ./*.whl; else pip install --no-cache-dir .; fi \
 && rm -rf /tmp/model-package/*
WORKDIR /opt/tritonship
ENV TRITONSHIP_IMAGE=${IMAGE}
USER 10001
