"""The registries' one implementation: names mapped to what plugins and built-ins register
(algorithm classes, models, dataset sources, partitions, topologies, task targets), each a
`Registry` of its own. The same code registered again (its module imported twice, a notebook
cell run again) replaces its entry; other code under a taken name is one line naming both."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from typing import Generic, TypeVar

Entry = TypeVar("Entry")

# What a registered name may be made of (every registry's).
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")


def identity(code: object) -> str:
    """module.QualifiedName of a class or function: what tells a re-import from other code."""
    return f"{getattr(code, '__module__', '?')}.{getattr(code, '__qualname__', repr(code))}"


class Registry(dict[str, Entry], Generic[Entry]):
    """name -> entry for the experiment field `field` (e.g. "algorithm.name"); `code_of(entry)`
    is the class or function an entry was registered from (its identity decides a clash)."""

    def __init__(self, field: str, code_of: Callable[[Entry], object] = lambda entry: entry):
        super().__init__()
        self.field, self.code_of = field, code_of

    def clash(self, name: str, entry: Entry) -> str | None:
        """The one line refusing `entry` under `name`, or None: free, or the same code."""
        known = self.get(name)
        if known is None:
            return None
        before, now = identity(self.code_of(known)), identity(self.code_of(entry))
        if before == now:
            return None
        return f"{self.field}: '{name}' is registered twice ({before} and {now})"

    def add(self, name: str, entry: Entry) -> Entry:
        """Register `entry` under `name` (one-line ValueError for a name other code holds)."""
        refusal = self.clash(name, entry)
        if refusal is not None:
            raise ValueError(refusal)
        self[name] = entry
        return entry

    def lookup(self, name: str) -> Entry:
        """The entry registered as `name` (one-line ValueError naming the allowed ones)."""
        if name not in self:
            raise ValueError(self.unknown(name))
        return self[name]

    def unknown(self, name: object, field: str | None = None) -> str:
        """The one line refusing `name`, not registered: the registered names, the one it
        is a near miss of, and where a plugin's names come from. `field`: the experiment's
        field it was given in (default this registry's; '' for none: pydantic adds it)."""
        field = self.field if field is None else field
        names = sorted(self)
        close = difflib.get_close_matches(str(name), names, n=1, cutoff=0.6)
        line = f"'{name}' is not one of {', '.join(names)}"
        line += f" (did you mean {close[0]}?)" if close else ""
        line += "; a plugin's name is known once its file is listed under `plugins:`"
        return f"{field}: {line}" if field else line
