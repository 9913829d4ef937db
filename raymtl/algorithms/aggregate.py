"""The maths algorithms share to combine what they receive: a fixed order for an inbox, the
finiteness guard, the weighted average, and the experiment's toolbox around them (Flower's
`aggregate` module, as pure torch).

    by_sender(inbox)            messages sorted by (sender, kind): float sums that do not
                                depend on arrival order (inline and Ray give equal results)
    weighted_average(updates)   Σ_k w_k·x_k / Σ_k w_k over the finite updates (None: none)
    combine(updates, ctx, ...)  the experiment's `aggregation` rule over the finite updates
                                (mean by samples by default: weighted_average itself), and
                                on a server with `privacy` its clipped noisy mean (§9.1, 9.3)
    server_update(state, ...)   the experiment's `server_optimizer` on Δ_t (§9.2)

An averaging step calls `combine` and `server_update` where it used `weighted_average`, and
so gets every aggregation rule, server optimiser and central DP without knowing which.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch

from raymtl.algorithms.base import SERVER, Message, State, StepContext
from raymtl.toolbox.settings import Toolbox

log = logging.getLogger(__name__)

Tensors = dict[str, torch.Tensor]
DEFAULT_TOOLBOX = Toolbox()
KRUM = ("krum", "multi_krum")


def by_sender(inbox: list[Message]) -> list[Message]:
    """Messages in a fixed order (by sender), so sums are order independent.

    Args:
        inbox: the messages a step received, in any order.

    Returns:
        The same messages sorted by sender, then kind.
    """
    return sorted(inbox, key=lambda message: (message.src, message.kind))


def is_finite(tensors: dict[str, torch.Tensor]) -> bool:
    """True when no tensor holds NaN or inf (non-finite updates are never aggregated).

    Args:
        tensors: tensors by name (a model, an update).

    Returns:
        Whether every entry of every tensor is finite.
    """
    return all(bool(torch.isfinite(t).all()) for t in tensors.values())


def weighted_average(
    updates: Iterable[tuple[dict[str, torch.Tensor], float]],
) -> dict[str, torch.Tensor] | None:
    """Σ_k w_k·x_k / Σ_k w_k over finite updates; None when none is usable.

    The caller fixes the order of `updates` (sorted by sender) so the float sum
    is the same whatever order the messages arrived in.

    Args:
        updates: (tensors x_k, weight w_k) pairs, in a fixed order.

    Returns:
        The weighted mean by name, or None when no update is finite or the weights of the
        finite ones sum to 0 or less.
    """
    finite = finite_only(updates)
    total = sum(weight for _, weight in finite)
    if not finite or total <= 0:
        return None
    return weighted_sum(finite, total)


def weighted_sum(
    updates: list[tuple[dict[str, torch.Tensor], float]], total: float
) -> dict[str, torch.Tensor]:
    """Σ_k (w_k/total)·x_k for every name of the first update, summed in the order given
    (the tensor part of `weighted_average`, where the updates are)."""
    return {
        name: sum(tensors[name] * (weight / total) for tensors, weight in updates)
        for name in updates[0][0]
    }


def finite_only(updates: Iterable[tuple[Tensors, float]]) -> list[tuple[Tensors, float]]:
    """The updates whose tensors are all finite, in the order given (a warning for each
    other: non-finite updates are never aggregated)."""
    finite = []
    for tensors, weight in updates:
        if is_finite(tensors):
            finite.append((tensors, weight))
        else:
            log.warning("rejected a non-finite update (not aggregated)")
    return finite


def combine(
    updates: Iterable[tuple[Tensors, float]],
    ctx: StepContext | None = None,
    state: State | None = None,
    reference: Tensors | None = None,
    slot: str = "",
) -> Tensors | None:
    """The models `updates` [(x_k, n_k)] combined as the experiment says (`ctx.toolbox`), in
    the order given; None when nothing can be combined (then the caller keeps its model).

    - no privacy: the `aggregation` rule (§9.1) over the finite updates; the default (mean
      by samples) is `weighted_average` itself, bit for bit;
    - client-level DP with central noise, on the server: the models become updates
      Δ_k = x_k − `reference` (w_t, what they were trained from), clipped after any decoding,
      summed with Gaussian noise and divided by m_t (§9.3); the result is w_t + Δ_t. The
      clip bound lives in `state.extras` (adaptive clipping moves it), under `slot` where
      one aggregator combines several models (IFCA's clusters).

    Args:
        updates: (model x_k, samples n_k) pairs, in a fixed order (`by_sender`).
        ctx: the step's context, whose `toolbox` says how to combine; None: the mean by
            samples.
        state: the aggregator's state (central DP keeps its clip bound in its extras).
        reference: w_t, the model the updates were trained from (central DP's updates are
            taken against it).
        slot: the name under which `state.extras` keeps this model's clip bound, where one
            aggregator combines several models.

    Returns:
        The combined model by name, or None when nothing can be combined.
    """
    toolbox = ctx.toolbox if ctx is not None else DEFAULT_TOOLBOX
    finite = finite_only(updates)
    if not finite:
        return None
    privacy = toolbox.privacy
    central = privacy.client_level and privacy.noise != "local"
    if central and ctx is not None and ctx.me == SERVER and reference is not None:
        from raymtl.algorithms.private_sum import private_combine

        return private_combine(finite, ctx, state, reference, slot)
    settings = toolbox.aggregation
    if settings.is_default():
        return weighted_average(finite)
    from raymtl.toolbox.rules import combine as by_rule
    from raymtl.toolbox.rules import krum_refusal

    combined = by_rule(finite, settings)
    reason = krum_refusal(len(finite), settings.f) if settings.rule in KRUM else None
    if combined is None and reason is not None:
        where = ctx.me if ctx is not None else "aggregator"
        log.warning("%s keeps its model this round: %s", where, reason)
    return combined


def server_update(
    state: State, reference: Tensors, combined: Tensors, ctx: StepContext | None, slot: str = ""
) -> Tensors:
    """w_{t+1} from w_t (`reference`) and the combined models: the experiment's server
    optimiser on Δ_t = combined − w_t (§9.2), its moments kept in `state.extras` (under
    `slot` where one server keeps several models); without one, `combined` itself.

    Args:
        state: the server's state, whose extras keep the optimiser's moments.
        reference: w_t, the server's model before the round.
        combined: the round's combined models (`combine`).
        ctx: the step's context, whose `toolbox` names the server optimiser; None: none.
        slot: the name under which `state.extras` keeps this model's moments.

    Returns:
        w_{t+1} by name.
    """
    toolbox = ctx.toolbox if ctx is not None else DEFAULT_TOOLBOX
    settings = toolbox.server_optimizer
    if settings.is_default():
        return combined
    from raymtl.toolbox.server_optimizers import server_step

    key = f"server_optimizer{slot}"
    stepped, state.extras[key] = server_step(
        settings, reference, combined, state.extras.get(key, {})
    )
    return stepped
