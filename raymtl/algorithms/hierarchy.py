"""Averaging inside hierarchical FL when users' models differ in their task layers.

An LPS may hold users of different tasks (different heads, losses, targets). Every tensor
is averaged only among the users that hold it with the same key:

    key(name) = (shape, −1)    for common layers (shared by every task)
    key(name) = (shape, task)  for the task's own layers (heads never mix across tasks)

and each user gets back the averages of its own keys. With one task this is plain
hierarchical FedAvg: the same sums in the same order.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from raymtl.algorithms.aggregate import combine, is_finite
from raymtl.algorithms.base import SERVER, Message, client_name

COMMON = -1  # the task key of common layers


def signature(
    tensors: dict[str, torch.Tensor], task: int = COMMON, common: tuple[str, ...] = ()
) -> dict[str, tuple]:
    """{name: (shape, task key)}: the key a tensor is averaged under (see the module)."""
    return {
        name: (tuple(tensor.shape), COMMON if name.startswith(common) else task)
        for name, tensor in tensors.items()
    }


def shape_average(
    updates: list[tuple[dict, float, dict]], ctx=None
) -> dict[str, dict[tuple, torch.Tensor]]:
    """Weighted average of every tensor over the updates holding it under the same key — or
    the experiment's aggregation rule (`aggregate.combine` with the step's `ctx`), tensor by
    tensor: Krum's vectors here are each tensor's.

    `updates`: (tensors, weight, signature). Returns {name: {key: average}}; non-finite
    updates are left out whole.
    """
    groups: dict[tuple, list] = defaultdict(list)
    for tensors, weight, keys in updates:
        if not is_finite(tensors):
            continue
        for name, tensor in tensors.items():
            groups[(name, keys[name])].append(({name: tensor}, weight))
    store: dict[str, dict[tuple, torch.Tensor]] = defaultdict(dict)
    for (name, key), group in sorted(groups.items()):
        average = combine(group, ctx)
        if average is not None:
            store[name][key] = average[name]
    return dict(store)


def pick(store: dict, keys: dict[str, tuple]) -> dict[str, torch.Tensor]:
    """The stored averages matching one participant's {name: key}."""
    return {name: store[name][key] for name, key in keys.items() if key in store.get(name, {})}


def common_of(store: dict, common: tuple[str, ...], where: str) -> dict[str, torch.Tensor]:
    """The common layers of an LPS's store (one average each)."""
    shared = {}
    for name, by_key in store.items():
        if not name.startswith(common):
            continue
        if len(by_key) > 1:
            raise ValueError(f"common_prefixes: {name} has several shapes in {where}")
        shared[name] = next(iter(by_key.values()))
    return shared


def replies_by_signature(store: dict, messages, src: str, kind: str) -> list[Message]:
    """One reply per message, built from the store; equal key sets share one payload."""
    replies, outbox = {}, []
    for message in messages:
        keys = signature(message.tensors)
        cache_key = tuple(sorted(keys.items()))
        replies.setdefault(cache_key, pick(store, keys))  # stored once per key set
        outbox.append(Message(src, message.src, kind, replies[cache_key]))
    return outbox


def lps_broadcast(state, gps_inbox, keys_by_client: dict, me: str) -> list[Message]:
    """An LPS's reply to each of its users: its store (the GPS's common layers merged in),
    picked by the user's keys; users with equal key sets share one payload."""
    store = state.extras.get("model")
    if not store:
        return []
    for message in gps_inbox:  # the GPS average of the common layers
        for name, tensor in message.tensors.items():
            store[name] = {(tuple(tensor.shape), COMMON): tensor}
    outbox, payloads = [], {}
    for client, keys in sorted(keys_by_client.items()):
        cache_key = tuple(sorted(keys.items()))
        payloads.setdefault(cache_key, pick(store, keys))  # stored once per key set
        outbox.append(Message(me, client_name(client), "lps_model", payloads[cache_key]))
    return outbox


class CommonLayers:
    """What the GPS of hierarchical FL averages: `algorithm.params.common_prefixes`, or the
    model's own `common_prefixes()` (a model is built once to ask it)."""

    _model_common: tuple[str, ...] | None = None  # the model's own, once asked

    def common_prefixes(self) -> tuple[str, ...]:
        if self.params.common_prefixes is not None:
            return tuple(self.params.common_prefixes)
        if self._model_common is None:
            self._model_common = tuple(self.model_factory(SERVER, 1).common_prefixes())
        return self._model_common
