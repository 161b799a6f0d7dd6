"""Promote: the gated candidate rolled out replica by replica, the first ones measured as a canary; and what
brings production back when a promotion dies.

    promote          the promote and reject steps: the release lease, and the promotion as a state machine (its
                     phases copy, canary, roll, finish, and their transitions) that returns how it ended
    plan             what a promotion is asked to do, and what it changed, which a revert undoes
    records          the typed promotion record, its phases, outcomes and endings
    canary           live rounds on the canary and the rest, and the canary's decision
    settings         promote's settings and the canary's; canary_report the canary's report
    rollout          one replica switched or reverted
    cancel           SIGTERM and SIGINT turned into a revert, clean-up shielded from them
    reconcile        replicas brought back to the desired state in S3, killed promotions settled"""
