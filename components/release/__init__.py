"""What a release does: the steps from a compiled folder to production, and how each one decides. Imports the
serving, repository and model rooms and the ground floor.

Its own rooms, whose imports run downward too (tests/test_layers.py):

    (release/*.py)   what every room shares: publish, stage, results (every step's result type), effects (the
                     anytime-valid effects the gate, quality and canary decide on), effect_plot, gate_turn (one
                     measurement at a time on a gate server, through its lease), run_context (what every step is
                     handed beside its settings: repository, model, version, gate, S3, run id)
    tune/, quality/  the measuring steps that come before the gate
    gate/            the gate (its report shows quality's)
    promote/         promote and reject, the canary, rollout, cancel and reconcile
    step_settings    every step's settings type, and which command and pipeline task takes which
"""
