"""Tune: the candidate's serving settings searched on the gate at the gate's load (config overrides; S3 untouched).

tune             the search, its ranking and its result
bench            each setting loaded on the gate and measured"""
