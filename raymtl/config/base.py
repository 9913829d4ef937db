"""What every section of the experiment's configuration shares: the `Section` base of every
pydantic section, the one line taken from a pydantic error, near misses of unknown keys, and
sizes in bytes ('16GB', '512MiB')."""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, ValidationError

# "params.width: ...": a message that starts with the field (path) it is about.
FIELD_PREFIX = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z0-9_]+)*: ")


class Section(BaseModel):
    # inf and NaN are never a setting (lr=.inf once became `lr: null` in config.yaml)
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12}
UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def size_in_bytes(value: int | str) -> int | None:
    """12, '12GB', '1.5 GiB' -> bytes (None: not a size)."""
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"\s*([0-9]+\.?[0-9]*)\s*([a-zA-Z]*)\s*", value)
    if not match or match.group(2).lower() not in UNITS:
        return None
    return int(float(match.group(1)) * UNITS[match.group(2).lower()])


# Names other libraries and papers give settings, and the key raymtl uses for each: a near
# miss difflib cannot see (learning_rate is no misspelling of lr).
SYNONYMS = {
    "learning_rate": "lr",
    "learningrate": "lr",
    "local_lr": "lr",
    "client_lr": "lr",
    "local_epochs": "epochs",
    "num_epochs": "epochs",
    "n_epochs": "epochs",
    "epoch": "epochs",
    "batchsize": "batch_size",
    "bs": "batch_size",
    "local_batch_size": "batch_size",
    "sgd_momentum": "momentum",
    "wd": "weight_decay",
    "max_grad_norm": "clip_grad",
    "grad_clip": "clip_grad",
    "clip_norm": "clip_grad",
    "fraction": "sample_fraction",
    "client_fraction": "sample_fraction",
    "frac": "sample_fraction",
    "clients": "num_clients",
    "n_clients": "num_clients",
    "num_rounds": "rounds",
    "seed": "seeds",
}


def did_you_mean(key: str, allowed: Iterable[str]) -> str:
    """' (did you mean num_clients?)' when `key` is a near miss of an allowed one (or
    another name for one, `SYNONYMS`: learning_rate -> lr), else ''."""
    allowed = [str(name) for name in allowed]
    synonym = SYNONYMS.get(str(key).lower())
    if synonym in allowed:
        return f" (did you mean {synonym}?)"
    close = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


def section_keys(model: type[BaseModel], path: Iterable[object]) -> list[str]:
    """The keys of the section at `path` inside `model` ([] where the path leaves plain
    sections: a list's item, a mapping's value, one of several section types)."""
    for part in path:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        if field is None:
            return []
        sections = [kind for kind in _kinds(field.annotation) if _is_section(kind)]
        # a section, or a section or None; not a list or mapping of sections
        plain = typing.get_origin(field.annotation) in (None, typing.Union, types.UnionType)
        if len(sections) != 1 or not plain:
            return []
        model = sections[0]
    return list(model.model_fields)


def _kinds(annotation: object) -> list[object]:
    """`annotation` and, for `X | None`, its members."""
    return [annotation, *typing.get_args(annotation)]


def _is_section(kind: object) -> bool:
    return isinstance(kind, type) and issubclass(kind, BaseModel)


def first_error(
    error: ValidationError, prefix: str = "", model: type[BaseModel] | None = None
) -> str:
    """One line from a pydantic error: 'field.path: message'. With the validated `model`,
    an unknown key names the allowed key it is a near miss of."""
    detail = error.errors()[0]
    location = ".".join(str(part) for part in detail["loc"])
    location = ".".join(part for part in (prefix, location) if part)
    message = detail["msg"].removeprefix("Value error, ")
    if detail["type"] == "extra_forbidden":
        *parents, key = detail["loc"]
        allowed = section_keys(model, parents) if model is not None else []
        message = "unknown key" + did_you_mean(key, allowed)
    message = message.splitlines()[0] if message else message
    if location and message.startswith(f"{location}."):  # a rule naming the whole path
        return message
    if location and FIELD_PREFIX.match(message):  # a section's rule names its own field
        return f"{location}.{message}"
    return f"{location}: {message}" if location else message
