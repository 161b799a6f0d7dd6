"""What a release does: the steps from a compiled folder to production, and how each one decides. Imports the
serving, repository and model rooms and the ground floor.

    publish          an immutable version in the S3 repository, manifest written last
    stage            the candidate loaded dark on the gate, its accuracy checked
    tune             serving settings searched on the gate (tune_bench: each setting loaded and measured)
    quality          the candidate against stable on labelled data (quality_spec, quality_metrics, quality_report)
    gate             the candidate measured against stable, verdict and report (gate_stats, gate_report)
    gate_turn        one measurement (quality, tune, gate) at a time on a gate server, through its lease
    effect_plot      each limit's interval plotted against the limit, for the gate's, canary's and quality's reports
    promote          the promotion's phases (first the canary: canary, canary_settings, canary_report); cancel turns
                     SIGTERM into a revert, rollout switches or reverts one replica
    reconcile        replicas brought back to the desired state in S3, killed promotions settled
    results          every step's result type
    step_settings    every step's settings type, and which command and pipeline task takes which
"""
