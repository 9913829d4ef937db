"""The one way in for experiments: whatever a user gives (an `ExperimentConfig`, a mapping, a
YAML path, a comparison file's `arms:`, `a.b=value` overrides, one of which may fan out as
`a.b=x,y`) becomes validated experiments here, and `run`, `compare`, `tune`, `Federation`
and the CLI all call it."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from pathlib import Path

from raymtl.config import ConfigError, ExperimentConfig, apply_override, load_raw, parse_config
from raymtl.errors import one_line

Experiment = ExperimentConfig | Mapping | str | Path


def raw_experiment(experiment: Experiment, overrides: Iterable[str] = ()) -> dict:
    """The experiment as a raw mapping (a copy), with `a.b=value` overrides applied."""
    if isinstance(experiment, ExperimentConfig):
        raw = experiment.model_dump(mode="json")
    elif isinstance(experiment, Mapping):
        raw = copy.deepcopy(dict(experiment))
    elif isinstance(experiment, str | Path):
        raw = load_raw(experiment)
    else:
        raise ConfigError(
            f"experiment: give an ExperimentConfig, a mapping or a YAML path, "
            f"not {type(experiment).__name__}"
        )
    for assignment in overrides:
        apply_override(raw, assignment)
    return raw


def experiment_config(experiment: Experiment, overrides: Iterable[str] = ()) -> ExperimentConfig:
    """The validated experiment (an `ExperimentConfig` without overrides is taken as it is)."""
    overrides = list(overrides)
    if isinstance(experiment, ExperimentConfig) and not overrides:
        return experiment
    return parse_config(raw_experiment(experiment, overrides))


def experiment_configs(
    experiments: list[Experiment], overrides: list[str] = ()
) -> list[ExperimentConfig]:
    """Experiments and `a.b=v` overrides -> configs; a comparison file's `arms` are one
    experiment each (`arms_of`); `a.b=x,y` fans each experiment out into several, named
    `<name>-<value>` (a file without a name: its stem)."""
    if not experiments:
        raise ConfigError("compare: give at least one experiment")
    fan_key, fan_values = None, [None]
    for item in overrides:
        key, _, value = item.partition("=")
        # A YAML list or mapping (rotations=[0,90]) is one value, not values to fan out.
        if "," in value and not value.lstrip().startswith(("[", "{")):
            if fan_key is not None:
                raise ConfigError(f"{key}: only one override may list several values")
            fan_key, fan_values = key, [v.strip() for v in value.split(",")]
    fixed = [item for item in overrides if not item.startswith(f"{fan_key}=")]
    configs = []
    for experiment in experiments:
        base = raw_experiment(experiment)
        if isinstance(experiment, str | Path):
            base.setdefault("name", Path(experiment).stem)
        arms = arms_of(base)
        for arm in arms:
            arm = raw_experiment(arm, fixed)  # the overrides apply to every arm
            for value in fan_values:
                raw = raw_experiment(arm)  # a copy per value
                if fan_key is not None:
                    apply_override(raw, f"{fan_key}={value}")
                    raw["name"] = f"{raw.get('name', 'experiment')}-{value}"
                fanned = None if fan_key is None else f"{fan_key}={value}"
                try:
                    configs.append(parse_config(raw))
                except ConfigError as error:
                    if fanned is None and len(arms) == 1:
                        raise  # one experiment: the line is the file's, as raymtl run says
                    raise ConfigError(
                        arm_refused(one_line(error), raw.get("name"), fanned)
                    ) from None
    return configs


def arm_refused(line: str, arm: str | None, fanned: str | None) -> str:
    """The line an arm of a comparison was refused with, naming the arm (and the value of
    `a.b=x,y` that made it) and, for a setting given to every arm, how to give it to one
    arm only: a comparison file's `arms:`."""
    refused = f"arm {arm}" + (f" ({fanned})" if fanned else "") + f": {line}"
    if fanned is None or line.startswith(f"{fanned.partition('=')[0]}:"):
        return refused
    return (
        f"{refused}; the experiment's settings and overrides go to every arm: give one arm "
        "settings of its own in a comparison file's `arms:` (each arm's `algorithm` brings "
        'its own params; README, "A comparison file: arms")'
    )


def arms_of(base: dict) -> list[dict]:
    """A comparison file's experiments: one per entry of its `arms` mapping (arm name ->
    sections), named after the arm, each section of the arm replacing the base's section of
    that name whole (an arm's `algorithm` brings its own params); the file itself when it
    has no arms."""
    arms = base.pop("arms", None)
    if arms is None:
        return [base]
    if not isinstance(arms, dict) or not arms:
        raise ConfigError("arms: give a mapping of arm name -> the sections it replaces")
    experiments = []
    for name, sections in arms.items():
        if not isinstance(sections, dict):
            raise ConfigError(f"arms.{name}: give the sections it replaces (a mapping)")
        experiments.append({**base, **sections, "name": str(name)})
    return experiments
