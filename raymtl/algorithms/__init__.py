"""Pure federated algorithms (torch only; never Ray). Importing registers them."""

from raymtl.algorithms import dpsgd, fedavg, hfedavg  # noqa: F401  (registration)
from raymtl.algorithms.registry import all_algorithms, get_algorithm, register

__all__ = ["all_algorithms", "get_algorithm", "register"]
