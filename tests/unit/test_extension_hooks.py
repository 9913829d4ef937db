"""The extension surface is documented one way and registered under one name per kind.

Docstrings: every hook of `Algorithm` a plugin may override, the helpers of `StepContext`
and `FederationInfo` its steps call, every function `raymtl.extend` exports and every
registrar have a Google-style docstring: an `Args:` section naming each parameter when the
function takes any, a `Returns:` section when it returns something, and a `Raises:` section
when it raises itself (or is a registrar, which refuses a broken plugin in one line).

Names: each kind a plugin registers (algorithm, model, dataset, partition, topology, task
target) has one registrar, `register_<kind>`, under that name only, in every public
namespace; the repository's code, docs and examples use that name.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from pathlib import Path

import pytest

import raymtl
import raymtl.algorithms
import raymtl.algorithms.registry
import raymtl.data
import raymtl.extend
import raymtl.graph
import raymtl.models
import raymtl.tasks
from raymtl.algorithms.base import Algorithm, FederationInfo, StepContext
from raymtl.metrics.extras import table_plotter, table_reporter

ROOT = Path(__file__).resolve().parents[2]

# kind -> its one registrar.
REGISTRARS = {
    "algorithm": raymtl.extend.register_algorithm,
    "model": raymtl.extend.register_model,
    "dataset": raymtl.extend.register_dataset,
    "partition": raymtl.extend.register_partition,
    "topology": raymtl.extend.register_topology,
    "target": raymtl.extend.register_target,
}
# Registrars of an algorithm's own tables' reporters and plotters (raymtl/metrics/extras.py).
TABLE_REGISTRARS = (table_reporter, table_plotter)


def own_methods(cls: type) -> dict[str, object]:
    """The public methods `cls` itself defines, by name, and its `__init__` unless a
    dataclass wrote it; properties left out."""
    methods = {}
    own_init = not dataclasses.is_dataclass(cls)
    for name, value in vars(cls).items():
        if isinstance(value, classmethod | staticmethod):
            value = value.__func__
        if inspect.isfunction(value) and ((name == "__init__" and own_init) or name[0] != "_"):
            methods[f"{cls.__name__}.{name}"] = value
    return methods


def documented_functions() -> dict[str, object]:
    functions = {}
    functions |= own_methods(Algorithm)
    functions |= own_methods(StepContext)
    functions |= own_methods(FederationInfo)
    for name in raymtl.extend.__all__:
        value = getattr(raymtl.extend, name)
        if inspect.isfunction(value):
            functions[name] = value
    for registrar in TABLE_REGISTRARS:
        functions[registrar.__name__] = registrar
    return functions


FUNCTIONS = documented_functions()


def sections(docstring: str) -> dict[str, list[str]]:
    """A Google-style docstring's sections (`Args:`, `Returns:`, ...) -> their lines."""
    found: dict[str, list[str]] = {}
    current = None
    for line in docstring.splitlines():
        heading = re.fullmatch(r"(Args|Returns|Raises|Yields|Attributes|Examples?):", line)
        if heading:
            current = found.setdefault(heading.group(1), [])
        elif current is not None and (line.startswith(" ") or not line.strip()):
            current.append(line)
        else:
            current = None
    return found


def documented_arguments(lines: list[str]) -> list[str]:
    """The names of an Args section's entries (`name: ...` or `name (type): ...`)."""
    names = []
    for line in lines:
        match = re.match(r"    (\*{0,2}\w+)(?: \([^)]*\))?: ", line)
        if match:
            names.append(match.group(1))
    return names


def arguments(name: str, function) -> list[str]:
    """The parameters a caller gives, as an Args section names them (`*parts`, `**row`);
    a method's (`Class.name`) first, self or cls, left out."""
    names = []
    parameters = list(inspect.signature(function).parameters.values())
    for parameter in parameters[1:] if "." in name else parameters:
        prefix = {parameter.VAR_POSITIONAL: "*", parameter.VAR_KEYWORD: "**"}.get(
            parameter.kind, ""
        )
        names.append(prefix + parameter.name)
    return names


def own_body(function) -> list[ast.AST]:
    """The nodes of `function`'s body, nested functions and classes left out."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    definition = tree.body[0]
    nodes, stack = [], list(definition.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
            continue
        nodes.append(node)
        stack.extend(ast.iter_child_nodes(node))
    return nodes


def returns_something(function) -> bool:
    annotation = inspect.signature(function).return_annotation
    if annotation is not inspect.Signature.empty:
        return annotation not in (None, "None")
    return any(
        isinstance(node, ast.Return)
        and node.value is not None
        and not (isinstance(node.value, ast.Constant) and node.value.value is None)
        for node in own_body(function)
    )


def raises(function) -> bool:
    return any(isinstance(node, ast.Raise) for node in own_body(function))


def test_the_surface_is_what_a_plugin_author_overrides_and_calls():
    hooks = {
        "Algorithm.__init__",
        "Algorithm.phases",
        "Algorithm.init_state",
        "Algorithm.eval_model",
        "Algorithm.batched_step",
        "Algorithm.state_size",
        "Algorithm.persistent_bytes",
        "Algorithm.check_resources",
        "Algorithm.uplink_reference",
        "Algorithm.rehost",
        "StepContext.record",
        "StepContext.report",
        "register_algorithm",
        "register_model",
        "register_dataset",
        "register_partition",
        "register_topology",
        "register_target",
        "local_sgd",
        "combine",
    }
    assert hooks <= set(FUNCTIONS), sorted(hooks - set(FUNCTIONS))


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_hook_has_google_style_args_and_returns(name):
    function = FUNCTIONS[name]
    docstring = inspect.getdoc(function)
    assert docstring, f"{name}: no docstring"
    assert not re.search(
        r"^\s*(Parameters|Returns)\n\s*-{3,}|:param |:returns?:", docstring, re.M
    ), f"{name}: not Google style (numpydoc or reST fields)"
    found = sections(docstring)
    wanted = arguments(name, function)
    if wanted:
        assert "Args" in found, f"{name}: takes {', '.join(wanted)} but has no Args: section"
        assert documented_arguments(found["Args"]) == wanted, (
            f"{name}: Args: documents {documented_arguments(found['Args'])}, takes {wanted}"
        )
    else:
        assert "Args" not in found, f"{name}: takes nothing but has an Args: section"
    if returns_something(function):
        assert "Returns" in found and any(line.strip() for line in found["Returns"]), (
            f"{name}: returns something but has no Returns: section"
        )
    else:
        assert "Returns" not in found, f"{name}: returns nothing but has a Returns: section"
    if raises(function) or function in REGISTRARS.values():
        assert "Raises" in found, f"{name}: raises but has no Raises: section"


def test_algorithm_documents_the_step_signature():
    docstring = inspect.getdoc(Algorithm)
    after = docstring[docstring.index("A step, ") :].splitlines()[1:]
    # Its indented block, up to the next paragraph of the class docstring.
    block = []
    for line in after:
        if line.strip() and not line.startswith(" "):
            break
        block.append(line)
    found = sections(textwrap.dedent("\n".join(block)))
    assert documented_arguments(found["Args"]) == ["state", "inbox", "ctx"]
    assert "outbox" in "\n".join(found["Returns"])


def public_names(module) -> list[str]:
    return list(module.__all__)


NAMESPACES = {
    "raymtl": raymtl,
    "raymtl.extend": raymtl.extend,
    "raymtl.algorithms": raymtl.algorithms,
    "raymtl.models": raymtl.models,
    "raymtl.data": raymtl.data,
    "raymtl.graph": raymtl.graph,
    "raymtl.tasks": raymtl.tasks,
}


@pytest.mark.parametrize("namespace", sorted(NAMESPACES))
def test_one_registrar_name_per_kind(namespace):
    module = NAMESPACES[namespace]
    names = sorted(raymtl.__all__) if module is raymtl else public_names(module)
    for kind, registrar in REGISTRARS.items():
        assert registrar.__name__.startswith("register_")
        aliases = [name for name in names if getattr(module, name) is registrar]
        assert aliases in ([], [registrar.__name__]), f"{namespace}: {kind} registered as {aliases}"
    registering = [name for name in names if name.startswith("register")]
    assert set(registering) <= {registrar.__name__ for registrar in REGISTRARS.values()}
    if module in (raymtl, raymtl.extend):
        assert set(registering) == {registrar.__name__ for registrar in REGISTRARS.values()}


# `@register`, `from raymtl... import register` or a line `    register,` of an import's list.
OLD_NAME = re.compile(
    r"@register\b(?!_)|^\s*from raymtl\S* import [^\n#]*\bregister\b(?!_)|^\s+register,$", re.M
)


def test_the_repository_uses_the_registrar_names():
    texts = [
        *ROOT.glob("raymtl/**/*.py"),
        *ROOT.glob("tests/**/*.py"),
        *ROOT.glob("examples/**/*.py"),
        *ROOT.glob("examples/**/*.md"),
        *ROOT.glob("jobs/**/*.py"),
        *ROOT.glob("docs/*.md"),
        *ROOT.glob("benchmarks/*.py"),
        ROOT / "README.md",
    ]
    old = {
        path.relative_to(ROOT).as_posix()
        for path in texts
        if path.is_file()
        and path != Path(__file__).resolve()  # its pattern names the old name
        and OLD_NAME.search(path.read_text(encoding="utf-8"))
    }
    assert not old, f"uses `register`, not register_<kind>: {sorted(old)}"
    assert not hasattr(raymtl.algorithms.registry, "register")
