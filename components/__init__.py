"""tritonship steps: plain, KFP-free functions that export, compile, publish, stage, gate and promote.

Rooms, each importing only from the ones below it (tests/test_layers.py keeps it so; docs/design.md has the map):

    release/     what a release does: publish, stage, tune, gate, promote (with its canary), reject, reconcile
    serving/     how Triton is reached: admin API, replicas, perf_analyzer, metrics    | beside each other,
    repository/  the S3 model repository: versions, manifests, desired state, history  | never importing each other
    model/       what a model is: signature, export, compile, parity, config, folder, ensemble
    (here)       the ground floor: errors, log, clock, settings (every named default), settings_model (what a
                 step's settings type is made of), the S3 client
"""
