"""The toolbox sections' rules that need the rest of the experiment (docs/ALGORITHMS.md §9):
what the algorithm honours (`Algorithm.toolbox`), Krum's cohort, DP's combinations and its
budget. Each raises one line that names the field; called by `ExperimentConfig`'s validator.
"""

from __future__ import annotations

from raymtl.algorithms.base import Algorithm
from raymtl.algorithms.registry import get_algorithm
from raymtl.algorithms.training import sample_size
from raymtl.toolbox.settings import Toolbox

# Each toolbox section, the part of `Algorithm.toolbox` it needs, and what it does, for the
# refusals.
NEEDS = {
    "aggregation": ("aggregation", "an aggregation rule"),
    "server_optimizer": ("server_optimizer", "a server optimiser"),
    "privacy": ("privacy", "client-level DP with central noise"),
    "compression": ("uplink", "uplink compression"),
    "attack": ("uplink", "update attacks"),
}


def check_toolbox(cfg) -> None:
    """The toolbox sections set in `cfg` are honoured by its algorithm and fit its cohort."""
    algorithm = get_algorithm(cfg.algorithm.name)
    toolbox = cfg.toolbox()
    for section in used_sections(toolbox):
        part, what = NEEDS[section]
        if part not in algorithm.toolbox:
            raise ValueError(refusal(section, cfg.algorithm.name, algorithm, what, part))
    cohort = sample_size(cfg.algorithm.typed_params().sample_fraction, cfg.data.num_clients)
    check_krum(toolbox, cohort)
    check_privacy(cfg, toolbox, cohort)


def used_sections(toolbox: Toolbox) -> list[str]:
    """The sections that ask an algorithm for something: a non-default rule or optimiser,
    client-level DP with central noise (local noise and sample-level DP-SGD need an uplink,
    or nothing), compression, and update attacks (label flips need no uplink)."""
    used = []
    if not toolbox.aggregation.is_default():
        used.append("aggregation")
    if not toolbox.server_optimizer.is_default():
        used.append("server_optimizer")
    privacy = toolbox.privacy
    if privacy.client_level:
        used.append("privacy" if privacy.noise != "local" else "compression")
    if not toolbox.compression.is_default():
        used.append("compression")
    if not toolbox.attack.is_default() and toolbox.attack.kind != "label_flip":
        used.append("attack")
    return list(dict.fromkeys(used))


def refusal(section: str, name: str, algorithm: type[Algorithm], what: str, part: str) -> str:
    field = {"aggregation": "aggregation.rule", "server_optimizer": "server_optimizer.name"}
    field |= {"compression": "compression.uplink", "attack": "attack.kind"}
    field |= {"privacy": "privacy.noise"}
    why = algorithm.toolbox_refusals.get(part) or algorithm.combines_otherwise
    if part == "uplink" and algorithm.shapes[0] in ("peer", "groups", "none"):
        why = f"its clients send to {'peers' if algorithm.shapes[0] != 'none' else 'nobody'}, "
        why += "not up to a server or LPS"
    reason = f" ({why})" if why else ""
    return f"{field[section]}: {name} does not take {what}{reason}"


def check_krum(toolbox: Toolbox, cohort: int) -> None:
    settings = toolbox.aggregation
    if settings.rule not in ("krum", "multi_krum"):
        return
    if cohort < 2 * settings.f + 3:
        raise ValueError(
            f"aggregation.f: Krum needs m >= 2f + 3; the cohort is m = {cohort} clients a "
            f"round, so f is at most {max(0, (cohort - 3) // 2)} (or sample more clients)"
        )
    if settings.keep is not None and settings.keep > cohort - settings.f:
        raise ValueError(
            f"aggregation.keep: {settings.keep} is more than m − f = {cohort - settings.f}"
        )


def check_privacy(cfg, toolbox: Toolbox, cohort: int) -> None:
    """DP's combinations (§9.3): a robust rule has no sensitivity bound; adaptive clipping
    needs 2σ_b > σ; δ below 1/N; and the budget, when a target ε is given."""
    privacy = toolbox.privacy
    if privacy.sample_level is not None and cfg.runtime.batch_clients > 1:
        raise ValueError(
            "privacy.sample_level: DP-SGD trains client by client; set runtime.batch_clients: 1"
        )
    if not privacy.client_level:
        return
    population = cfg.data.num_clients
    if privacy.noise != "local" and toolbox.aggregation.robust():
        raise ValueError(
            f"aggregation.rule: {toolbox.aggregation.rule} with central DP has no sensitivity "
            "bound (the noise is calibrated to a clipped sum): use rule: mean, or noise: local"
        )
    if privacy.clipping == "adaptive":
        if privacy.noise == "local":
            raise ValueError("privacy.clipping: adaptive needs central noise (server or client)")
        from raymtl.toolbox.privacy import default_count_sigma, sigma_delta

        sigma_delta(privacy.noise_multiplier, privacy.count_noise or default_count_sigma(cohort))
    delta = privacy_delta(cfg)
    if delta >= 1 / population:
        raise ValueError(
            f"privacy.delta: {delta:g} is not below 1/N = {1 / population:g} (N = {population})"
        )
    if privacy.target_epsilon is None:
        return
    spent = spent_epsilon(cfg, cfg.rounds)
    if spent > privacy.target_epsilon:
        from raymtl.toolbox.accounting import rounds_within

        most = 0  # local noise: each round a client takes part in is a release of its own
        if privacy.noise != "local":
            sigma, accounting = privacy.noise_multiplier, privacy.accounting
            most = rounds_within(
                privacy.target_epsilon, sigma, cohort, population, delta, accounting, cfg.rounds
            )
        fits = f"run at most {most} rounds" if most else "even one round spends more"
        raise ValueError(
            f"privacy.target_epsilon: {cfg.rounds} rounds would spend ε = {spent:.3g} at "
            f"δ = {delta:g}, over the target {privacy.target_epsilon:g}; {fits}, or raise "
            "privacy.noise_multiplier"
        )


def privacy_delta(cfg) -> float:
    """δ of the reported ε: privacy.delta, else min(1e-5, N^−1.1)."""
    from raymtl.toolbox.privacy import default_delta

    given = cfg.privacy.delta
    return given if given is not None else default_delta(cfg.data.num_clients)


def spent_epsilon(cfg, rounds: int, releases: int | None = None) -> float:
    """ε at δ (`privacy_delta`) after `rounds` rounds. Central noise: the sampled Gaussian
    with noise multiplier σ over the configured cohort (with adaptive clipping, σ_Δ and the
    count's 2σ_b together spend exactly what σ alone would, §9.3). Local noise: a client's
    `releases` Gaussian releases (default: one a round), without amplification."""
    from raymtl.toolbox.accounting import central_epsilon, local_epsilon

    privacy, population = cfg.privacy, cfg.data.num_clients
    sigma, delta = privacy.noise_multiplier, privacy_delta(cfg)
    if privacy.noise == "local":
        return local_epsilon(sigma, rounds if releases is None else releases, delta)
    cohort = sample_size(cfg.algorithm.typed_params().sample_fraction, population)
    return central_epsilon(sigma, cohort, population, rounds, delta, privacy.accounting)
