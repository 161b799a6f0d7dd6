"""Quality: the staged candidate against stable on labelled rows, decided on each metric's interval.

spec             the quality spec (metrics, limits, label columns) and QualitySettings
metrics          each metric per row, and its paired effect
quality          the step: rows sent to both versions on the gate, the decision and its record
calibration      retrain-to-retrain variation measured on the user's data, recorded in S3
report           the quality report"""
