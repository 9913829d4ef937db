"""The override language: `a.b.c=value` assignments (the value parsed as YAML) applied to an
experiment's raw mapping, and a search's sampled values set by their dotted keys."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import yaml

from raymtl.errors import ConfigError


def apply_override(raw: dict, assignment: str) -> None:
    """Apply one `a.b.c=value` override in place (value parsed as YAML)."""
    path, sep, value = assignment.partition("=")
    if not sep or not path:
        raise ConfigError(f"override '{assignment}': expected key.path=value")
    *parents, leaf = path.split(".")
    node = raw
    for part in parents:
        if isinstance(node, list):  # data.tasks.2.source: an item of a list
            node = list_item(node, part, path)
            continue
        child = node.setdefault(part, {})
        if not isinstance(child, dict | list):
            raise ConfigError(f"{path}: '{part}' is not a section")
        node = child
    try:
        value = yaml.safe_load(value)
    except yaml.YAMLError:
        problem = f"'{value}' is not a YAML value (quote strings, close brackets)"
        raise ConfigError(f"{path}: {problem}") from None
    if isinstance(node, list):
        list_item(node, leaf, path)  # checks the index
        node[int(leaf)] = value
    else:
        node[leaf] = value


def list_item(items: list, part: str, path: str):
    """The item `part` (an index) of a list along an override's path."""
    if not part.isdigit() or int(part) >= len(items):
        raise ConfigError(f"{path}: '{part}' is not an index of a list of {len(items)} items")
    return items[int(part)]


def set_setting(raw: dict, key: str, value: Any) -> None:
    """raw[a][b][c] = value for the dotted key `a.b.c` (sections made where missing)."""
    *parents, leaf = key.split(".")
    node = raw
    for part in parents:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--param: {key}: '{part}' is not a section")
        node = child
    node[leaf] = value


def with_values(base: dict, values: Mapping[str, Any]) -> dict:
    raw = copy.deepcopy(base)
    for key, value in values.items():
        set_setting(raw, key, value)
    return raw
