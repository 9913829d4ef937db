"""Floating-point operations a run performs, counted by torch's FlopCounterMode: a model pass
once per kind (its cost follows from shapes alone) and multiplied; a coordinator's step every
time it runs (its cost may follow from what its inbox holds).

Two kinds of work are counted, both with `torch.utils.flop_counter.FlopCounterMode` (which
counts the matrix products and convolutions: 2·m·n·k for an (m×k)·(k×n) product; elementwise
operations count zero):

- **Model passes** (clients' training, adaptation and evaluation). Inside `FlopMeter.passes()`,
  every outermost call of an `nn.Module` (a model, or a part of one called on its own, such as
  a head on features) is one pass. Its key is (the module's class and parameter shapes, the
  shapes and dtypes of its inputs, whether autograd records it). The first pass of a key is
  replayed once on a copy of the module on the meta device under FlopCounterMode (no data,
  no compute); every later pass of that key adds the figure found. A pass under autograd
  counts its forward and one backward of every parameter that requires a gradient (the
  training step it is part of); a pass under `torch.no_grad()` counts its forward only.
- **Coordinators' steps** (server, LPS, task leaders, graph service). `FlopMeter.step(run)`
  runs every step under FlopCounterMode: a step's cost may change from round to round with
  the same inbox size (the communities a graph step finds, the clusters IFCA keeps).

Work counted by hand: `add_passes` (the batched trainer, whose vmapped passes the module
hooks see one client at a time) and `add_flops` (an algorithm's own products in a client's
step, outside any module call: Sheaf-FMTL's restriction maps).
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

log = logging.getLogger(__name__)

# The meter whose passes() is open in this thread of control (None: nothing is counted).
_ACTIVE: ContextVar[_Tally | None] = ContextVar("raymtl_flop_tally", default=None)


@dataclass
class _Tally:
    """What one `passes()` block counted, and the hooks' bookkeeping while it is open."""

    meter: FlopMeter
    flops: float = 0.0
    depth: int = 0  # modules being called: only a call at depth 0 is a pass of its own
    paused: int = 0  # > 0 inside `paused()` and while a pass is being measured


def module_key(module: nn.Module) -> tuple:
    """What a module's FLOPs depend on: its class, and its parameters' shapes and whether
    they take gradients (a frozen body skips its weight gradients)."""
    kind = type(module)
    shapes = tuple((name, tuple(p.shape), p.requires_grad) for name, p in module.named_parameters())
    return (kind.__module__, kind.__qualname__, shapes)


def inputs_key(args: tuple, kwargs: dict) -> tuple:
    """The shapes and dtypes of a call's tensor arguments (everything else by its repr)."""
    leaves, _ = tree_flatten((args, kwargs))
    return tuple(
        (tuple(leaf.shape), str(leaf.dtype)) if isinstance(leaf, torch.Tensor) else repr(leaf)
        for leaf in leaves
    )


def measure_pass(module: nn.Module, args: tuple, kwargs: dict, training: bool) -> float:
    """FLOPs of one call of `module` (and its backward when `training`), on a meta copy:
    the shapes decide the count, so no data is touched and nothing is computed. A module
    the meta device cannot run (data-dependent shapes) is measured on a CPU copy instead."""
    try:
        return _counted_pass(bare_copy(module).to("meta"), args, kwargs, training, "meta")
    except (NotImplementedError, RuntimeError):
        return _counted_pass(bare_copy(module).to("cpu"), args, kwargs, training, "cpu")


def bare_copy(module: nn.Module) -> nn.Module:
    """A deep copy of `module` without the hooks others put on it (Opacus's per-sample
    gradient hooks under sample-level DP): the model's own pass is what is counted."""
    copied = copy.deepcopy(module)
    for part in copied.modules():
        for hooks in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks"):
            getattr(part, hooks).clear()
        part._backward_pre_hooks.clear()
    return copied


def _counted_pass(copied: nn.Module, args, kwargs, training: bool, device: str) -> float:
    leaves, spec = tree_flatten((args, kwargs))
    moved = [
        torch.zeros_like(leaf, device=device) if isinstance(leaf, torch.Tensor) else leaf
        for leaf in leaves
    ]
    call_args, call_kwargs = spec.unflatten(moved)
    from torch.utils.flop_counter import FlopCounterMode  # imports triton where installed

    with FlopCounterMode(display=False) as counter, torch.set_grad_enabled(training):
        output = copied(*call_args, **call_kwargs)
        if training:
            # One backward through every output that autograd recorded: the training step's.
            outputs = [
                t
                for t in tree_flatten(output)[0]
                if isinstance(t, torch.Tensor) and t.requires_grad
            ]
            if outputs:
                sum(t.float().sum() for t in outputs).backward()
    return float(counter.get_total_flops())


def warm_up_counting() -> None:
    """Pay counting's one-time costs now: FlopCounterMode's module imports triton where it is
    installed, and its first use imports torch._dynamo (seconds on a small machine). Every
    host counts FLOPs in round 1 (a coordinator's step, a client's first pass), so a host
    calls this while it starts, and round 1 pays only the counts."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False):
        torch.ones(1, 1) @ torch.ones(1, 1)


class FlopMeter:
    """A host's FLOP counts: model passes cached per key for the life of the host."""

    def __init__(self) -> None:
        self._per_pass: dict[tuple, float] = {}

    @contextlib.contextmanager
    def passes(self) -> Iterator[_Tally]:
        """Count the model passes run inside the block; the tally's `flops` is their sum."""
        tally = _Tally(self)
        token = _ACTIVE.set(tally)
        handles = (
            nn.modules.module.register_module_forward_pre_hook(_before_call),
            nn.modules.module.register_module_forward_hook(_after_call, always_call=True),
        )
        try:
            yield tally
        finally:
            for handle in handles:
                handle.remove()
            _ACTIVE.reset(token)

    def pass_flops(self, module: nn.Module, args: tuple, kwargs: dict, training: bool) -> float:
        """FLOPs of one pass (measured the first time its key is seen)."""
        key = (module_key(module), inputs_key(args, kwargs), training)
        if key not in self._per_pass:
            try:
                self._per_pass[key] = measure_pass(module, args, kwargs, training)
            except Exception as error:  # counting must never stop a run: unknown is NaN
                log.warning("FLOPs of %s not counted: %s", type(module).__name__, error)
                self._per_pass[key] = math.nan
        return self._per_pass[key]

    def step(self, run: Callable[[], object]) -> tuple[object, float]:
        """Run a coordinator's step: its result and the FLOPs it performed."""
        from torch.utils.flop_counter import FlopCounterMode

        with FlopCounterMode(display=False) as counter, paused():
            result = run()
        return result, float(counter.get_total_flops())


def add_passes(module: nn.Module, inputs: torch.Tensor, training: bool, times: int) -> None:
    """Count `times` passes of `module` on `inputs` by hand (no-op outside `passes()`): work
    the hooks cannot see as it is, such as a pass vmapped over several clients' models."""
    tally = _ACTIVE.get()
    if tally is not None and times > 0:
        tally.paused += 1
        try:
            tally.flops += times * tally.meter.pass_flops(module, (inputs,), {}, training)
        finally:
            tally.paused -= 1


def add_flops(count: float) -> None:
    """Add `count` FLOPs of work done outside module calls (an algorithm's own tensor maths
    in a client's step, e.g. products with restriction maps); a no-op outside `passes()`.

    Args:
        count: the floating-point operations done.
    """
    tally = _ACTIVE.get()
    if tally is not None:
        tally.flops += float(count)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Model passes inside the block are not counted by the hooks (counted another way)."""
    tally = _ACTIVE.get()
    if tally is None:
        yield
        return
    tally.paused += 1
    try:
        yield
    finally:
        tally.paused -= 1


def _before_call(module: nn.Module, args: tuple) -> None:
    tally = _ACTIVE.get()
    if tally is None or tally.paused:
        return
    if tally.depth == 0:
        training = torch.is_grad_enabled() and any(p.requires_grad for p in module.parameters())
        tally.paused += 1  # the measurement's own calls are not passes
        try:
            tally.flops += tally.meter.pass_flops(module, args, {}, training)
        finally:
            tally.paused -= 1
    tally.depth += 1


def _after_call(module: nn.Module, args: tuple, output) -> None:
    tally = _ACTIVE.get()
    if tally is None or tally.paused:
        return
    tally.depth = max(0, tally.depth - 1)
