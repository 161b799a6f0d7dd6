"""The gate: the candidate measured against stable with perf_analyzer until its limits decide.

    gate             rounds measured (duet or alternating), the verdict and its record
    calibration      the gate server's noise for a model (A/A rounds), and which limits a budget can decide
    report           the verdict's Markdown and HTML report

Its settings (GateSettings, nesting the load's LoadSettings) are components/settings.py's: tune and calibrate
measure at the gate's load too. The effects and their intervals are release/effects.py's, shared with quality and
the canary."""
