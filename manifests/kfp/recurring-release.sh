#!/usr/bin/env bash
# Example: release a nightly-retrained model at 03:00 every day (KFP cron: 6 fields, seconds first).
# The pipeline runs as the tritonship-pipeline service account (manifests/rbac/) and reads S3
# credentials from the Secret tritonship-s3 in its namespace (or IRSA).
set -euo pipefail
tritonship schedule \
  --host "${KFP_HOST:?set KFP_HOST to the KFP API endpoint}" \
  --name nightly-recommender-release \
  --cron "0 0 3 * * *" \
  --service-account tritonship-pipeline \
  -p model_source=recsys.models:build_recommender \
  -p checkpoint=s3://training/recommender/latest/state_dict.pt \
  -p 'signature={"batch": true, "max_batch_size": 64, "inputs": [{"name": "item_ids", "dtype": "int64", "shape": [-1, 40], "range": [0, 50000]}, {"name": "mask_pos", "dtype": "int64", "shape": [-1, 1], "range": [0, 40]}], "outputs": [{"name": "topk_indices", "dtype": "int64", "shape": [-1, 10]}, {"name": "topk_scores", "dtype": "fp32", "shape": [-1, 10]}]}' \
  -p model_name=recommender \
  -p repository=s3://models/tritonship \
  -p replicas=k8s://triton/app.kubernetes.io/component=production \
  -p gate=k8s://triton/app.kubernetes.io/component=gate \
  -p max_p99_ms=20 \
  -p min_throughput=500
