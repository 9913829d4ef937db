"""Pure federated algorithms (torch only; never Ray).

Importing the package imports every module in it, which registers the algorithms
(`@register_algorithm`): a new algorithm is a new module, with no list to edit.
"""

import importlib
import pkgutil

from raymtl.algorithms.registry import (
    all_algorithms,
    check_contract,
    get_algorithm,
    register_algorithm,
)

for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")

__all__ = [
    "all_algorithms",
    "check_contract",
    "get_algorithm",
    "register_algorithm",
]
