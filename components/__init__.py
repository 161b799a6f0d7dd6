"""tritonship steps: plain, KFP-free functions that export, compile, publish, stage, gate and promote."""
