"""`raymtl.Federation` holds the runtime's federation (composition, no subclass): only its
documented names are public and nothing of the runtime's internals is reachable on it. The
runtime's `Federation` runs rounds and recovers: the run folder, the pre-flight check, the
run's callbacks and summary are the API's; recovery and injected faults are loop/recovery.py's.
(The federation run round by round: tests/integration/test_federation_api.py.)"""

from __future__ import annotations

import ast
import inspect

import raymtl
from raymtl.runtime.loop import federation as runtime_federation
from raymtl.runtime.loop import recovery
from raymtl.runtime.loop.federation import Federation as LiveFederation

PUBLIC = {"cfg", "seed", "run_dir", "round", "done", "run_round", "state", "close"}


def own_names(cls) -> set[str]:
    """Every name reachable on `cls` that a Python object does not have anyway."""
    return set(dir(cls)) - set(dir(object))


def test_the_public_federation_composes_the_runtime_one():
    assert not issubclass(raymtl.Federation, LiveFederation)
    assert LiveFederation not in raymtl.Federation.__mro__
    names = own_names(raymtl.Federation)
    private = {n for n in names if n.startswith("_") and not n.startswith("__")}
    assert not private, private
    runtime_private = {
        n for n in own_names(LiveFederation) if n.startswith("_") and not n.startswith("__")
    }
    assert not names & runtime_private
    assert {"_until", "_open"}.isdisjoint(names)
    assert {n for n in names if not n.startswith("__")} == PUBLIC
    assert {"__enter__", "__exit__"} <= names


def test_the_public_federation_documents_its_names():
    for name in PUBLIC:
        assert inspect.getdoc(getattr(raymtl.Federation, name)), name


def module_names(module) -> set[str]:
    """The names a module's code uses (imports and calls included)."""
    tree = ast.parse(inspect.getsource(module))
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)} | {
        node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)
    }


def test_the_runtime_federation_runs_rounds_and_recovers_only():
    used = module_names(runtime_federation)
    # the own run is the API's: no reopened folder, no run callbacks, no summary
    assert not {"reopen_run", "finish_run", "on_run_start", "on_run_end", "_own_run"} & used
    # recovery and injected faults are loop/recovery.py's
    assert not {"HostsLost", "kill_host", "injection_schedule", "fault_rows"} & used
    assert {"HostsLost", "kill_host", "injection_schedule", "fault_rows"} <= module_names(recovery)
    methods = [
        node
        for node in ast.parse(inspect.getsource(LiveFederation)).body[0].body
        if isinstance(node, ast.FunctionDef)
    ]
    assert len(methods) <= 12, [m.name for m in methods]
