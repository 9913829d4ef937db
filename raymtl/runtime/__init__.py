"""The only package that imports Ray: actors, executors, router and the round loop."""

from raymtl.runtime.api import resume_experiment, run_experiment, start_ray

__all__ = ["resume_experiment", "run_experiment", "start_ray"]
