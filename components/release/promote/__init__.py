"""Promote: the gated candidate rolled out replica by replica, the first ones measured as a canary; and what
brings production back when a promotion dies.

    promote          the promote and reject steps: the release lease, the promotion's run and its outcome
    promotion        the promotion's phases and transitions (copy, canary, roll, finish), a state machine
    records          the typed promotion record, its phases and outcomes
    canary           live rounds on the canary and the rest, and the canary's decision
    settings         promote's settings and the canary's; canary_report the canary's report
    rollout          one replica switched or reverted
    cancel           SIGTERM and SIGINT turned into a revert, clean-up shielded from them
    reconcile        replicas brought back to the desired state in S3, killed promotions settled"""
