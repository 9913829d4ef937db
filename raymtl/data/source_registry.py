"""Dataset sources: the `Pool` a source returns, the registry of sources and `load_pool`.

A source is a function `fn(root, download, **params) -> Pool` registered under the name
`data.name` gives it:

    @register_dataset("bars")
    def load_bars(root=None, download=False, seed=0, num_samples=1200) -> Pool:
        '''One line for `raymtl list`.'''

Its keyword parameters beyond `root` and `download` are `data.params` (each with a default);
a source that takes `seed` gets the experiment's seed, and one that takes `num_clients` gets
`data.num_clients` (None when the experiment leaves it to the data). The pool joins the
dataset's train and test splits (`test_start` marks the official test split, if any); the
federation re-splits it per client.

Data already federated comes keyed by client: `register_dataset(name, keyed=True)` and a
Pool whose `keys` say which client holds each sample (and, optionally, which samples are
its test split and each client's group), or whose `generated` makes each client's samples
on the host that holds it (nothing on the driver but the counts). `data.partition.kind:
natural` (the default for keyed sources) gives each client exactly its own samples.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from raymtl.registry import NAME, Registry

# Arguments every source takes (and `seed` and `num_clients`, given to the sources that ask
# for them); the other keyword parameters are the source's own (`data.params`).
COMMON_ARGS = ("root", "download", "seed", "num_clients")

# What a pool's samples are: images (N, C, H, W); vectors of D features (N, 1, 1, D);
# tokens, D integer ids below `vocabulary` per sample (N, 1, 1, D), decoded as floats.
INPUT_KINDS = ("images", "vectors", "tokens")


@dataclass(frozen=True)
class ClientKeys:
    """Which client holds each sample of a pool, as the data keys them."""

    client: np.ndarray  # (N,) int64: the index in `names` of the sample's client
    names: tuple[str, ...]  # the data's client ids, in order (clients 0, 1, ... of `natural`)
    test: np.ndarray | None = None  # (N,) bool: in its client's given test split
    group: np.ndarray | None = None  # (K,) int64: each client's task or group (its column)
    where: str = ""  # the file or folder the keys came from, for errors


@dataclass(frozen=True)
class Generated:
    """Clients whose samples are generated where they are hosted: `counts[k]` samples of
    client k, `generate(k) -> (x float32 (n, C, H, W) in [0, 1]-scale units, y int64 (n,))`
    (a picklable callable: it travels to the hosts inside the pool)."""

    counts: np.ndarray  # (K,) int64
    generate: Callable[[int], tuple[torch.Tensor, torch.Tensor]]


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
    keys: ClientKeys | None = None  # data already federated: the client of each sample
    generated: Generated | None = None  # samples made per client on its host (x, y empty)
    inputs: str = "images"  # one of INPUT_KINDS
    vocabulary: int = 0  # tokens: the ids run 0..vocabulary - 1

    @property
    def num_keyed_clients(self) -> int | None:
        """The clients the data itself holds (None: a pool the partition splits)."""
        if self.generated is not None:
            return len(self.generated.counts)
        return len(self.keys.names) if self.keys is not None else None


class DatasetMissing(ValueError):
    """The dataset is not on disk and may not be downloaded."""


SOURCES: Registry[Callable[..., Pool]] = Registry("data.name")
# Sources whose data comes keyed by client (`natural` is their default partition).
KEYED_SOURCES: set[str] = set()


def register_dataset(
    name: str, keyed: bool = False
) -> Callable[[Callable[..., Pool]], Callable[..., Pool]]:
    """Decorator: make the source `fn(root, download, **params) -> Pool` `data.name: name`;
    `keyed`: its pools say which client holds each sample (Pool.keys or Pool.generated).

    Raises a one-line ValueError for a source that breaks the contract (see the module
    docstring) or a name taken by another source.

    Args:
        name: the source's name, as `data.name` gives it (letters, digits, _ . -).
        keyed: True for data already federated: its pools carry `keys` or `generated`, and
            `data.partition.kind: natural` is its default partition.

    Returns:
        The decorator: it registers the source function and returns it unchanged.

    Raises:
        ValueError: one line, from the decorator, for a bad name, a function that does not
            take (root, download, **params) with defaults, or a name another source holds.
    """

    def decorator(loader: Callable[..., Pool]) -> Callable[..., Pool]:
        check_source(name, loader)
        added = SOURCES.add(name, loader)
        if keyed:
            KEYED_SOURCES.add(name)
        return added

    return decorator


def is_keyed(name: str) -> bool:
    """Source `name` gives data already split by client."""
    return name in KEYED_SOURCES


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
        raise ValueError(SOURCES.unknown(name))
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
    if pool.inputs not in INPUT_KINDS:
        raise ValueError(f"{where}: Pool.inputs must be one of {', '.join(INPUT_KINDS)}")
    if pool.inputs == "tokens" and pool.vocabulary < 1:
        raise ValueError(f"{where}: a pool of tokens needs its vocabulary size")
    x, y = pool.x, pool.y
    if pool.generated is not None:
        return _check_generated(where, pool)
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
    if pool.keys is not None:
        _check_keys(where, pool.keys, len(y))
    return pool


def _check_keys(where: str, keys: ClientKeys, samples: int) -> None:
    client = np.asarray(keys.client)
    if client.shape != (samples,) or not np.issubdtype(client.dtype, np.integer):
        raise ValueError(f"{where}: Pool.keys.client must be ({samples},) client indices")
    if len(keys.names) == 0 or client.min() < 0 or client.max() >= len(keys.names):
        raise ValueError(f"{where}: Pool.keys.client must index its {len(keys.names)} names")
    if keys.test is not None and np.asarray(keys.test).shape != (samples,):
        raise ValueError(f"{where}: Pool.keys.test must be a ({samples},) bool mask")
    if keys.group is not None and np.asarray(keys.group).shape != (len(keys.names),):
        raise ValueError(f"{where}: Pool.keys.group must give each of the clients a group")


def _check_generated(where: str, pool: Pool) -> Pool:
    counts = np.asarray(pool.generated.counts)
    if counts.ndim != 1 or counts.size == 0 or (counts < 1).any():
        raise ValueError(f"{where}: Pool.generated.counts must give every client >= 1 sample")
    if not isinstance(pool.x, torch.Tensor) or pool.x.ndim != 4:
        raise ValueError(f"{where}: a generated Pool's x must be an empty (0, C, H, W) tensor")
    if pool.num_classes < 1 or len(pool.class_names) != pool.num_classes:
        raise ValueError(f"{where}: Pool.class_names must name its num_classes classes")
    return pool


_POOL_CACHE: dict[tuple, Pool] = {}


def _hashable(value: object) -> object:
    if isinstance(value, dict):
        return tuple(sorted((key, _hashable(item)) for key, item in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_hashable(item) for item in value)
    return value


def load_pool(
    name: str,
    root: str | None = None,
    download: bool = False,
    seed: int = 0,
    num_clients: int | None = None,
    **params,
) -> Pool:
    """Load dataset `name` as one Pool of its train+test splits, cached per process;
    `num_clients` reaches only the sources that make their clients (see the docstring)."""
    check_source_params(name, params)
    loader = SOURCES[name]
    taken = inspect.signature(loader).parameters
    if "seed" in taken:  # only random sources use the seed
        params = {**params, "seed": seed}
    if "num_clients" in taken:  # only sources that make their clients use the count
        params = {**params, "num_clients": num_clients}
    key = (name, root, download, _hashable(sorted(params.items())))
    if key not in _POOL_CACHE:
        _POOL_CACHE[key] = check_pool(name, loader(root=root, download=download, **params))
    return _POOL_CACHE[key]
