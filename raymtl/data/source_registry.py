"""Dataset sources: the `Pool` a source returns, the registry of sources and `load_pool`.

A source is a function `fn(root, download, **params) -> Pool` registered under the name
`data.name` gives it:

    @register_dataset("bars")
    def load_bars(root=None, download=False, seed=0, num_samples=1200) -> Pool:
        '''One line for `raymtl list`.'''

Its keyword parameters beyond `root` and `download` are `data.params` (each with a default);
a source that takes `seed` gets the experiment's seed. The pool joins the dataset's train and
test splits (`test_start` marks the official test split, if any); the federation re-splits
it per client.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch

from raymtl.registry import NAME, Registry

# Arguments every source takes (and `seed`, given to the sources that ask for it); the
# other keyword parameters are the source's own (`data.params`).
COMMON_ARGS = ("root", "download", "seed")


@dataclass(frozen=True)
class Pool:
    """A whole dataset in memory: compact samples plus what is needed to decode them."""

    x: torch.Tensor  # (N, C, H, W); uint8 for images, float32 for synthetic
    y: torch.Tensor  # (N,) int64
    num_classes: int
    class_names: tuple[str, ...]
    scale: float  # x.float() / scale lies in [0, 1]
    source: str  # where the data actually came from (a directory, "sklearn", "synthetic")
    test_start: int | None = None  # first sample of the official test split (None: no split)


class DatasetMissing(ValueError):
    """The dataset is not on disk and may not be downloaded."""


SOURCES: Registry[Callable[..., Pool]] = Registry("data.name")


def register_dataset(name: str) -> Callable[[Callable[..., Pool]], Callable[..., Pool]]:
    """Decorator: make the source `fn(root, download, **params) -> Pool` `data.name: name`.

    Raises a one-line ValueError for a source that breaks the contract (see the module
    docstring) or a name taken by another source.
    """

    def decorator(loader: Callable[..., Pool]) -> Callable[..., Pool]:
        check_source(name, loader)
        return SOURCES.add(name, loader)

    return decorator


def check_source(name: object, loader: object) -> None:
    """A one-line ValueError unless `loader` may be registered as source `name`."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"register_dataset: {name!r} is not a name (letters, digits, _ . -)")
    where = f"register_dataset('{name}')"
    if not callable(loader):
        raise ValueError(f"{where}: {loader!r} is not a function fn(root, download, **params)")
    refusal = SOURCES.clash(name, loader)
    if refusal is not None:
        raise ValueError(refusal)
    parameters = inspect.signature(loader).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    missing = [arg for arg in ("root", "download") if arg not in parameters]
    if missing and not takes_any:
        raise ValueError(
            f"{where}: {loader.__qualname__} must take {' and '.join(missing)} "
            "(fn(root, download, **params) -> Pool)"
        )
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    for parameter in parameters.values():
        own = parameter.name not in COMMON_ARGS and parameter.kind in named
        if own and parameter.default is inspect.Parameter.empty:
            raise ValueError(
                f"{where}: parameter '{parameter.name}' of {loader.__qualname__} needs a "
                "default (data.params may leave it out)"
            )


def source_params(name: str) -> dict[str, inspect.Parameter]:
    """The parameters `data.params` may give source `name`."""
    parameters = inspect.signature(SOURCES[name]).parameters.values()
    return {
        p.name: p
        for p in parameters
        if p.name not in COMMON_ARGS and p.kind is not inspect.Parameter.VAR_POSITIONAL
    }


def check_source_params(name: str, params: dict) -> None:
    """`data.params` are parameters of source `name` (one-line ValueError otherwise)."""
    if name not in SOURCES:
        raise ValueError(f"data.name: {name!r} is not one of {', '.join(SOURCES)}")
    accepted = source_params(name)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
        return
    for key in params:
        if key not in accepted:
            options = ", ".join(accepted) or "none"
            raise ValueError(f"data.params.{key}: not a parameter of source {name!r} ({options})")


def check_pool(name: str, pool: object) -> Pool:
    """What a source returned is a consistent Pool (one-line ValueError otherwise)."""
    where = f"data.name: source '{name}'"
    if not isinstance(pool, Pool):
        raise ValueError(f"{where} returned a {type(pool).__name__}, not a Pool")
    x, y = pool.x, pool.y
    if not isinstance(x, torch.Tensor) or x.ndim != 4 or len(x) == 0:
        raise ValueError(f"{where}: Pool.x must be a non-empty (N, C, H, W) tensor")
    if not isinstance(y, torch.Tensor) or y.shape != (len(x),) or y.dtype != torch.int64:
        raise ValueError(f"{where}: Pool.y must be an int64 tensor of shape ({len(x)},)")
    if pool.num_classes < 1 or len(pool.class_names) != pool.num_classes:
        raise ValueError(f"{where}: Pool.class_names must name its num_classes classes")
    if int(y.min()) < 0 or int(y.max()) >= pool.num_classes:
        raise ValueError(f"{where}: Pool.y must hold class ids 0..{pool.num_classes - 1}")
    if pool.test_start is not None and not 0 < pool.test_start < len(y):
        raise ValueError(f"{where}: Pool.test_start must be inside 1..{len(y) - 1}")
    return pool


_POOL_CACHE: dict[tuple, Pool] = {}


def _hashable(value: object) -> object:
    if isinstance(value, list | tuple):
        return tuple(_hashable(item) for item in value)
    return value


def load_pool(
    name: str, root: str | None = None, download: bool = False, seed: int = 0, **params
) -> Pool:
    """Load dataset `name` as one Pool of its train+test splits, cached per process."""
    check_source_params(name, params)
    loader = SOURCES[name]
    if "seed" in inspect.signature(loader).parameters:  # only random sources use the seed
        params = {**params, "seed": seed}
    key = (name, root, download, _hashable(sorted(params.items())))
    if key not in _POOL_CACHE:
        _POOL_CACHE[key] = check_pool(name, loader(root=root, download=download, **params))
    return _POOL_CACHE[key]
