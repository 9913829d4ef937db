"""The one place where algorithm names map to algorithm classes.

    @register_algorithm
    class FedAvg(Algorithm):
        name = "fedavg"
        ...

Everything else (config validation, the CLI's `list`, the runtime hosts) looks
algorithms up here, so adding an algorithm never touches an if/elif chain.
`register_algorithm` checks the class against the contract of `Algorithm` first
(`check_contract`), so a broken plugin fails where it is defined, in one line.
`algorithm_params` and `build_algorithm` make an algorithm from an experiment's settings: what
a plugin's `Params` or constructor raises there is one line naming the class and the settings.
"""

from __future__ import annotations

from pydantic import ValidationError

from raymtl.algorithms.base import (
    KEEPS,
    MODEL_SUPPORT,
    ROLES,
    SHAPES,
    TASK_SUPPORT,
    WHO,
    Algorithm,
    Params,
)
from raymtl.errors import ConfigError, raised, raised_at
from raymtl.registry import Registry, identity

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm.name")


def register_algorithm(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: check `cls` against the contract, then make it available under
    `cls.name`. Re-running the module that defines it (a plugin imported again) replaces
    the entry; another class under a taken name is refused.

    Args:
        cls: an `Algorithm` subclass with a `name` of its own (`algorithm.name`).

    Returns:
        `cls` itself, registered.

    Raises:
        ValueError: one line naming `cls`, when it breaks the contract (`check_contract`) or
            its name is another class's.
    """
    check_contract(cls)
    return ALGORITHMS.add(cls.name, cls)


def check_contract(cls: type) -> None:
    """Raise a one-line ValueError naming `cls` and what breaks the `Algorithm` contract.

    Args:
        cls: the class to check (anything: a non-class is refused too).

    Raises:
        ValueError: `algorithm class <module.Class>: <what breaks the contract>`.
    """
    where = f"algorithm class {identity(cls)}"
    problem = _contract_problem(cls)
    if problem:
        raise ValueError(f"{where}: {problem}")


def _contract_problem(cls: type) -> str | None:
    """What is wrong with `cls` as an algorithm, or None."""
    if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
        return "is not a subclass of raymtl.algorithms.base.Algorithm"
    name = vars(cls).get("name")
    if not isinstance(name, str) or not name.strip():
        inherited = getattr(cls, "name", None)
        also = f" (it would inherit '{inherited}')" if isinstance(inherited, str) else ""
        return f"declares no `name` (the string experiment files use as algorithm.name){also}"
    if not (isinstance(cls.Params, type) and issubclass(cls.Params, Params)):
        return f"Params is {cls.Params!r}, not a subclass of raymtl.algorithms.base.Params"
    attributes = [("shapes", cls.shapes, SHAPES), ("keeps", cls.keeps, KEEPS)]
    for attribute, values, allowed in attributes:
        if not isinstance(values, tuple) or not set(values) <= set(allowed):
            return f"{attribute} = {values!r}: a tuple of {', '.join(allowed)}"
    if not cls.shapes:
        return f"shapes is empty: name at least one of {', '.join(SHAPES)}"
    supports = [
        ("task_support", cls.task_support, TASK_SUPPORT),
        ("model_support", cls.model_support, MODEL_SUPPORT),
    ]
    for attribute, value, allowed in supports:
        if value not in allowed:
            return f"{attribute} = {value!r} is not one of {', '.join(allowed)}"
    if cls.phases is Algorithm.phases:
        return "does not define phases(round_index, rounds)"
    return _steps_problem(cls)


def _steps_problem(cls: type[Algorithm]) -> str | None:
    """A phase of round 1 or 2 (of 2) with an unknown role or `who`, or naming a step that
    `cls` does not define (checked with the default params)."""
    try:
        algorithm = cls(cls.Params(), None)
    except Exception:  # a user's code may raise anything
        # Fields without defaults, or a constructor that refuses the defaults (or always
        # raises): the phases can only be known from an experiment's settings, and the
        # driver reports what the constructor raised there, in one line (`build_algorithm`).
        return None
    for round_index in (1, 2):
        try:
            phases = list(algorithm.phases(round_index, 2))
        except Exception as error:
            text = str(error).splitlines()[0] if str(error) else ""
            return f"phases({round_index}, 2) raised {type(error).__name__}: {text}"
        for phase in phases:
            if phase.role not in ROLES:
                return f"a phase has role '{phase.role}', not one of {', '.join(ROLES)}"
            if phase.who not in WHO:
                return f"phase '{phase.step}' has who '{phase.who}', not one of {', '.join(WHO)}"
            if not callable(getattr(cls, phase.step, None)):
                return (
                    f"phases({round_index}, 2) names step '{phase.step}' ({phase.role}), "
                    "which it does not define"
                )
            if phase.batched is not None and phase.role != "client":
                return f"phase '{phase.step}' ({phase.role}) is batched: only client phases are"
            if phase.batched is not None and not callable(getattr(cls, phase.batched, None)):
                return (
                    f"phase '{phase.step}' names batched step '{phase.batched}', which it "
                    "does not define"
                )
    return None


def algorithm_params(name: str, values: dict) -> Params:
    """`values` (algorithm.params) validated by algorithm `name`'s `Params`. A pydantic
    ValidationError passes (config/checks.py names the field); anything else its validators
    raise is one ConfigError line naming the class, the settings and where it raised."""
    cls = get_algorithm(name)
    try:
        return cls.Params(**values)
    except ValidationError:
        raise
    except Exception as error:  # a user's code may raise anything
        call = f"{cls.__qualname__}.Params({settings(values)})"
        raise ConfigError(culprit_line(name, call, error, cls.Params)) from error


def build_algorithm(name: str, params: Params, model_factory=None) -> Algorithm:
    """Algorithm `name` built with `params`; an exception its constructor raises (a plugin's
    that refuses some settings, or always) is one ConfigError line naming the class, the
    settings it was given and where it raised: never a traceback, never taken for an import
    error."""
    cls = get_algorithm(name)
    try:
        return cls(params, model_factory)
    except Exception as error:  # a user's code may raise anything
        given = params.model_dump(exclude_unset=True) if isinstance(params, Params) else {}
        call = f"{cls.__qualname__}({settings(given) or 'default algorithm.params'})"
        raise ConfigError(culprit_line(name, call, error, cls)) from error


def settings(values: dict) -> str:
    """'beta=2.0, lr=0.1': algorithm.params as a call's arguments."""
    return ", ".join(f"{key}={value!r}" for key, value in values.items())


def culprit_line(name: str, call: str, error: BaseException, code: type) -> str:
    """`algorithm.params: Call(settings) raised Error: text (algorithm name, file:line)`."""
    where = raised_at(error, code)
    return f"algorithm.params: {call} raised {raised(error)} (algorithm {name}, {where})"


def get_algorithm(name: str) -> type[Algorithm]:
    """The algorithm class registered as `name` (one-line error otherwise)."""
    _load_builtin()
    return ALGORITHMS.lookup(name)


def all_algorithms() -> dict[str, type[Algorithm]]:
    """Every registered algorithm, by name."""
    _load_builtin()
    return dict(sorted(ALGORITHMS.items()))


def _load_builtin() -> None:
    # Importing the package registers the built-in algorithms (decorators run on import).
    import raymtl.algorithms  # noqa: F401
