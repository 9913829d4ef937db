"""What a client learns: its task's targets, loss, optimiser and metrics.

Importing the package registers the built-in targets (label, attributes, landmarks);
plugins add theirs with `register_target`.
"""

from raymtl.tasks import targets  # noqa: F401  (registers attributes and landmarks)
from raymtl.tasks.registry import TARGETS, Targets, TargetSpec, get_target, register_target

__all__ = ["TARGETS", "TargetSpec", "Targets", "get_target", "register_target"]
