"""Experiment trackers: callbacks that send a run's parameters, per-round metrics and outputs
to a tracking service (each an optional extra: `raymtl[mlflow]`)."""
