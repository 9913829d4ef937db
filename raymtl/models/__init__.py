"""Federated models: a backbone (shared representation) and a head (task layers).

Importing this package registers every built-in model in ``MODELS``.
"""

from raymtl.models import cnn, resnet, sheaf_cnns, text  # noqa: F401  (imports register them)
from raymtl.models.registry import (
    MODELS,
    FedModel,
    build_model,
    check_model_params,
    num_params,
    register_model,
)

__all__ = [
    "MODELS",
    "FedModel",
    "build_model",
    "check_model_params",
    "num_params",
    "register_model",
]
