"""Reporters of algorithm tables: every module here is imported by `metrics.extras`."""
