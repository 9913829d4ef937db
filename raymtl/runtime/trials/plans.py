"""How many trials run at once and what each asks Ray for: a placement group built from the
experiment's runtime settings, an empty head bundle for the trial's driver and one bundle per
client actor (num_cpus_per_actor, num_gpus_per_actor), so one trial's actors never take
another's room; `--parallel auto` runs as many trials as the cluster's CPUs and GPUs hold."""

from __future__ import annotations

import math
from dataclasses import dataclass

from raymtl.config import ConfigError, ExperimentConfig


@dataclass(frozen=True)
class ClusterRoom:
    """What the cluster holds in all: CPUs and GPUs."""

    cpus: float
    gpus: float

    @classmethod
    def now(cls) -> ClusterRoom:
        import ray

        resources = ray.cluster_resources()
        return cls(cpus=resources.get("CPU", 0.0), gpus=resources.get("GPU", 0.0))


def client_actors(cfg: ExperimentConfig, trial_cpus: float, trial_gpus: float | None = None) -> int:
    """The client actors a trial of `cfg` starts: an explicit clients_per_actor fixes them;
    `auto` fills the trial's share of the cluster (`trial_cpus`, and `trial_gpus` for actors
    that take GPUs; None: as many as the CPUs allow) once, as it fills the whole cluster in a
    run of its own."""
    runtime, num_clients = cfg.runtime, cfg.data.num_clients
    if runtime.clients_per_actor != "auto":
        return math.ceil(num_clients / runtime.clients_per_actor)
    fits = int(trial_cpus / runtime.num_cpus_per_actor + 1e-9)
    if runtime.num_gpus_per_actor and trial_gpus is not None:
        fits = min(fits, int(trial_gpus / runtime.num_gpus_per_actor + 1e-9))
    return max(1, min(num_clients, fits))


def trial_bundles(
    cfg: ExperimentConfig, trial_cpus: float, trial_gpus: float | None = None
) -> list[dict[str, float]]:
    """The placement group of one trial: an empty head bundle (the trial's driver) and a
    bundle per client actor; an inline run is the whole federation in the trial's own
    process, one bundle of num_cpus_per_actor."""
    runtime = cfg.runtime
    actor = {"CPU": float(runtime.num_cpus_per_actor)}
    if runtime.num_gpus_per_actor:
        actor["GPU"] = float(runtime.num_gpus_per_actor)
    if runtime.executor == "inline":
        return [actor]
    return [{}] + [dict(actor) for _ in range(client_actors(cfg, trial_cpus, trial_gpus))]


def bundles_total(bundles: list[dict[str, float]], resource: str) -> float:
    return sum(bundle.get(resource, 0.0) for bundle in bundles)


def parse_parallel(value: str | int) -> int | str:
    """`--parallel`: a positive whole number, or 'auto'."""
    if isinstance(value, int) or str(value).strip().isdigit():
        count = int(value)
        if count >= 1:
            return count
    elif str(value).strip() == "auto":
        return "auto"
    raise ConfigError(f"--parallel: give a number of trials (1 or more) or 'auto', not '{value}'")


def plan_trials(
    configs: list[ExperimentConfig], trials: int, parallel: int | str, room: ClusterRoom
) -> tuple[int, dict[str, list[dict[str, float]]]]:
    """(trials in flight at most, experiment name -> its trials' bundles).

    An explicit count shares the cluster's CPUs and GPUs among that many trials (for `auto`
    clients per actor); `auto` runs as many trials as the smallest trial layout fits."""
    if parallel == "auto":
        # With clients_per_actor: auto a trial needs one client actor at least.
        smallest = [trial_bundles(cfg, cfg.runtime.num_cpus_per_actor) for cfg in configs]
        need_cpus = max(bundles_total(b, "CPU") for b in smallest)
        need_gpus = max(bundles_total(b, "GPU") for b in smallest)
        fits = int(room.cpus / need_cpus + 1e-9) if need_cpus else trials
        if need_gpus:
            fits = min(fits, int(room.gpus / need_gpus + 1e-9))
        parallel = max(1, min(trials, fits))
    in_flight = min(parallel, trials)
    cpus, gpus = room.cpus / in_flight, room.gpus / in_flight
    plans = {cfg.name: trial_bundles(cfg, cpus, gpus) for cfg in configs}
    for name, bundles in plans.items():
        for resource, have in (("CPU", room.cpus), ("GPU", room.gpus)):
            need = bundles_total(bundles, resource)
            if need > have + 1e-9:
                raise ConfigError(
                    f"--parallel: a trial of '{name}' needs {need:g} {resource} "
                    f"(its client actors' runtime settings) and the cluster has {have:g}"
                )
    return in_flight, plans


def placement(bundles: list[dict[str, float]]):
    """Tune's resources for a trial: its placement group (bundles packed onto few nodes,
    so trials leave whole nodes to one another)."""
    from ray import tune

    return tune.PlacementGroupFactory(bundles, strategy="PACK")
