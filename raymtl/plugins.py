"""Plugins: the user's own modules that register algorithms, models, datasets, partitions,
topologies or task targets, named in an experiment's `plugins:` list.

An entry is a module name (`my_project.my_algorithm`, imported from sys.path) or a path to a
.py file. A file is imported under its own name (`fedavgm.py`: `fedavgm`), with its folder
added to sys.path as a script's is, so it may import its neighbours and `import fedavgm`
elsewhere finds the same module; when that name means another module (or is no identifier),
under `raymtl_plugin_<stem>_<hash of its path>`.

The driver loads the plugins while it parses the experiment, before anything is validated,
and every host before it builds anything: `load_plugins(entries, search_paths)` imports
each entry once per process, and again when its source changed since (the sha256 of the
file, or of a package's .py files): a process that outlives a command (`raymtl up`'s warm
actors) runs the plugin as it is now, and its registrations replace the old ones.
`search_paths()` names the folders the plugin modules were found in, so that a host on the
same machine (or on a shared file system) finds them too.

Every failure is one `ConfigError` line: a module that cannot be imported (its exception's
type and first line, no traceback), or a registration that breaks a registry's contract (the
registry's ValueError).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import keyword
import os
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

from raymtl.errors import ConfigError, one_line

# entry (a module name, or a file's resolved path) -> the module it loaded
_LOADED: dict[str, ModuleType] = {}
# entry -> the sha256 of the module's source when it was loaded (`source_digest`)
_DIGEST: dict[str, str] = {}
# module name -> the entry as the experiment names it (what `raymtl list` shows)
_ENTRY_OF_MODULE: dict[str, str] = {}
# folders the plugin modules were found in, in the order they were first seen
_FOUND_IN: list[str] = []

PATH_HINT = "a relative path is looked up next to the experiment file, then in the current folder"


def is_path(entry: str) -> bool:
    """Whether a plugin entry names a .py file (rather than a module on sys.path)."""
    return entry.endswith(".py") or "/" in entry or os.sep in entry


def resolve_entry(entry: object, folders: Iterable[Path | str] = ()) -> object:
    """A path entry made absolute: the first of `folders`, then the current folder, that holds
    it (as written when none does, so that loading names the missing file). Module names and
    anything that is not a string are returned unchanged (validation reports those)."""
    if not isinstance(entry, str) or not is_path(entry):
        return entry
    path = Path(entry).expanduser()
    if path.is_absolute():
        return str(path)
    for folder in [*folders, Path.cwd()]:
        candidate = Path(folder) / path
        if candidate.is_file():
            return str(candidate.resolve())
    return entry


def load_plugins(entries: Iterable[str] | None, search_paths: Iterable[str] = ()) -> None:
    """Import every plugin named in `entries`, each once per process.

    A module name that is not found on sys.path is looked for again with the folders of
    `search_paths` (those the driver found its plugins in) and the current folder added to
    it: the `raymtl` command, unlike `python -m`, does not put the current folder there.
    """
    for entry in entries or ():
        load_plugin(entry, tuple(search_paths))


def load_plugin(entry: str, search_paths: tuple[str, ...] = ()) -> ModuleType:
    """Import one plugin (see `load_plugins`); one-line ConfigError on failure."""
    if not isinstance(entry, str) or not entry.strip():
        raise ConfigError(f"plugins: {entry!r} is not a module name or a path to a .py file")
    key = str(Path(entry).expanduser().resolve()) if is_path(entry) else entry
    loaded = _LOADED.get(key)
    if loaded is not None and source_digest(loaded) == _DIGEST[key]:
        return loaded
    try:
        if loaded is not None:  # its source changed since: run it again, as it is now
            module = _reload(loaded)
        elif is_path(entry):
            module = _import_file(entry, Path(key))
        else:
            module = _import_module(entry, search_paths)
    except ConfigError:
        raise
    except ValueError as error:  # a registry refused what the plugin registers
        raise ConfigError(f"plugins: '{entry}': {one_line(error)}") from None
    except Exception as error:  # anything the module raised while it was imported
        problem = f"{type(error).__name__}: {one_line(error)}"
        raise ConfigError(f"plugins: '{entry}' could not be imported: {problem}") from None
    _LOADED[key], _DIGEST[key] = module, source_digest(module)
    _ENTRY_OF_MODULE[module.__name__] = Path(entry).name if is_path(entry) else entry
    _found_in(_root_folder(module))
    return module


def source_digest(module: ModuleType) -> str:
    """sha256 over the module's source: its .py file, or every .py file of its package's
    folder (sorted by path); '' for a module without files."""
    file = getattr(module, "__file__", None)
    if not file:
        return ""
    path = Path(file)
    files = sorted(path.parent.rglob("*.py")) if path.name == "__init__.py" else [path]
    digest = hashlib.sha256()
    for source in files:
        try:
            digest.update(str(source).encode() + b"\0" + source.read_bytes())
        except OSError:  # removed since: the digest differs from the one that read it
            digest.update(str(source).encode() + b"\0missing")
    return digest.hexdigest()


def _reload(module: ModuleType) -> ModuleType:
    """Run a changed plugin module again under its name; a package's modules are dropped from
    sys.modules first, so its own imports read their new source too."""
    name = module.__name__
    for other in [m for m in sys.modules if m.startswith(f"{name}.")]:
        del sys.modules[other]
    importlib.invalidate_caches()
    folders = getattr(module, "__path__", None)  # a package: its submodules are found there
    locations = list(folders) if folders is not None else None
    spec = importlib.util.spec_from_file_location(
        name, module.__file__, submodule_search_locations=locations
    )
    fresh = importlib.util.module_from_spec(spec)
    sys.modules[name] = fresh
    try:
        spec.loader.exec_module(fresh)
    except BaseException:
        sys.modules[name] = module  # the old one stays what a failed reload leaves
        raise
    return fresh


def search_paths() -> tuple[str, ...]:
    """The sys.path folders the plugins imported so far were found in."""
    return tuple(_FOUND_IN)


def plugin_of(module_name: str) -> str | None:
    """The plugin entry that defined `module_name` (or its package), None for raymtl's own
    modules; a module outside raymtl that no entry names is reported by its own name."""
    if module_name == "raymtl" or module_name.startswith("raymtl."):
        return None
    for name, entry in _ENTRY_OF_MODULE.items():
        if module_name == name or module_name.startswith(f"{name}."):
            return entry
    return module_name


def _import_module(name: str, search_paths: tuple[str, ...]) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        missing = [p for p in dict.fromkeys([*search_paths, os.getcwd()]) if p not in sys.path]
        if not missing or not _names_the_entry(error, name):
            raise
    sys.path.extend(missing)
    importlib.invalidate_caches()
    return importlib.import_module(name)


def _names_the_entry(error: ModuleNotFoundError, name: str) -> bool:
    # The entry itself (or its package) is missing, not a module the plugin imports.
    return error.name is not None and (name == error.name or name.startswith(f"{error.name}."))


def _import_file(entry: str, path: Path) -> ModuleType:
    if not path.is_file():
        raise ConfigError(f"plugins: '{entry}' is not a file ({PATH_HINT})")
    folder = str(path.parent)
    if folder not in sys.path:  # its neighbours import as a script's would
        sys.path.append(folder)
    name = _module_name(path)
    if name in sys.modules:  # imported already (by name, from this very file)
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    # In sys.modules while it runs: dataclasses and pickling look their module up by name.
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _module_name(path: Path) -> str:
    """The file's stem when importing that name finds this file; else a name of its own."""
    stem = path.stem
    if stem.isidentifier() and not keyword.iskeyword(stem):
        importlib.invalidate_caches()  # the file may be newer than a finder's listing
        try:
            found = importlib.util.find_spec(stem)
        except (ImportError, ValueError):
            found = None
        if found is not None and found.origin and Path(found.origin).resolve() == path:
            return stem
    digest = hashlib.sha1(str(path).encode()).hexdigest()[:8]
    return f"raymtl_plugin_{re.sub(r'[^0-9A-Za-z_]', '_', stem)}_{digest}"


def _root_folder(module: ModuleType) -> str | None:
    """The sys.path folder the module's top-level package was found in."""
    top = sys.modules.get(module.__name__.partition(".")[0], module)
    file = getattr(top, "__file__", None)
    if file:
        path = Path(file).resolve()
        return str(path.parent.parent if path.name == "__init__.py" else path.parent)
    locations = list(getattr(top, "__path__", ()))  # a namespace package
    return str(Path(locations[0]).resolve().parent) if locations else None


def _found_in(folder: str | None) -> None:
    if folder is not None and folder not in _FOUND_IN:
        _FOUND_IN.append(folder)
