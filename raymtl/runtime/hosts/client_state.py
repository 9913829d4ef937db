"""Clients' state as tensors: what an algorithm keeps between rounds, and nothing more.

A host holds no `nn.Module` per client. Each client's persistent state (`Algorithm.keeps`:
its model's tensors and/or its extras) is a *blob* `{"model": {name: tensor} | None,
"extras": dict}` kept here, resident up to the host's share of `runtime.memory_budget`, and
written to local disk beyond it (least recently used first): `torch.save`/`torch.load`, so a
spilled blob comes back bit-identical. Steps run on a few *working* models (`WorkingModels`,
one per architecture) whose weights the host overwrites in place from a blob before the step
and reads back after it.

Blobs are never changed in place (a step works on the working model; the host stores fresh
tensors after it), so blobs may share tensors: a client whose weights equal its
architecture's initial ones points at those (`template`), and costs nothing.
"""

from __future__ import annotations

import copy
import shutil
import tempfile
import uuid
from collections import OrderedDict
from pathlib import Path

import torch
from torch import nn

from raymtl.algorithms.training import load_tensors


def tensor_bytes(value) -> int:
    """Bytes of every tensor inside `value` (dicts, lists, tuples), shared ones once."""
    seen: dict[int, int] = {}

    def walk(item):
        if isinstance(item, torch.Tensor):
            seen[id(item)] = item.numel() * item.element_size()
        elif isinstance(item, dict):
            for inner in item.values():
                walk(inner)
        elif isinstance(item, list | tuple):
            for inner in item:
                walk(inner)

    walk(value)
    return sum(seen.values())


class ClientStates:
    """Per-client blobs, resident up to `budget` bytes and spilled to disk beyond it."""

    def __init__(self, budget: float = float("inf"), spill_root: str | None = None):
        self.budget = budget
        self.resident: OrderedDict[str, dict] = OrderedDict()  # least recently used first
        self.sizes: dict[str, int] = {}  # bytes of each blob (resident or spilled)
        self.spilled: dict[str, Path] = {}
        self.shared: set[int] = set()  # ids of tensors shared by all (templates): not counted
        self._spill_root, self._folder = spill_root, None

    def __contains__(self, participant: str) -> bool:
        return participant in self.resident or participant in self.spilled

    def get(self, participant: str) -> dict | None:
        """The client's blob (read back from disk if it was spilled); None if it has none."""
        if participant in self.resident:
            self.resident.move_to_end(participant)
            return self.resident[participant]
        if participant not in self.spilled:
            return None
        path = self.spilled.pop(participant)
        blob = torch.load(path, weights_only=True)
        path.unlink()
        self._keep(participant, blob)
        return blob

    def peek(self, participant: str) -> dict:
        """The client's blob without making it resident (a checkpoint reads every client)."""
        if participant in self.resident:
            return self.resident[participant]
        return torch.load(self.spilled[participant], weights_only=True)

    def put(self, participant: str, blob: dict | None) -> None:
        """Store (or, with None, forget) the client's blob; spill others while over budget."""
        self.forget(participant)
        if blob is not None:
            self._keep(participant, blob)

    def forget(self, participant: str) -> None:
        self.resident.pop(participant, None)
        self.sizes.pop(participant, None)
        path = self.spilled.pop(participant, None)
        if path is not None:
            path.unlink(missing_ok=True)

    def _keep(self, participant: str, blob: dict) -> None:
        self.resident[participant] = blob
        self.sizes[participant] = self._own_bytes(blob)
        while self.resident_bytes() > self.budget and len(self.resident) > 1:
            self._spill(next(iter(self.resident)))

    def _own_bytes(self, blob: dict) -> int:
        model = blob.get("model") or {}
        shared = sum(t.numel() * t.element_size() for t in model.values() if id(t) in self.shared)
        return tensor_bytes(blob) - shared

    def _spill(self, participant: str) -> None:
        blob = self.resident.pop(participant)
        path = self.folder() / f"{participant.replace('/', '_')}.pt"
        torch.save(blob, path)
        self.spilled[participant] = path

    def folder(self) -> Path:
        if self._folder is None:
            root = Path(self._spill_root or tempfile.gettempdir())
            self._folder = root / f"raymtl-spill-{uuid.uuid4().hex[:12]}"
            self._folder.mkdir(parents=True, exist_ok=True)
        return self._folder

    def resident_bytes(self) -> int:
        return sum(self.sizes[p] for p in self.resident)

    def report(self) -> dict:
        """What is resident and what is spilled, for rounds.parquet."""
        return {
            "state_resident_bytes": self.resident_bytes(),
            "state_spilled_bytes": sum(self.sizes[p] for p in self.spilled),
            "clients_resident": len(self.resident),
            "clients_spilled": len(self.spilled),
        }

    def close(self) -> None:
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None
        self.spilled.clear()


class WorkingModels:
    """One model per architecture whose weights are overwritten for each client it serves.

    `loaded[key]` is what was last copied in, by identity (weights, overlay): evaluating many
    clients with one model (FedAvg's global model) copies it in once, not once per client.
    """

    def __init__(self):
        self.models: dict[tuple, nn.Module] = {}
        self.templates: dict[tuple, dict[str, torch.Tensor]] = {}  # initial weights
        self.loaded: dict[tuple, tuple | None] = {}

    def adopt(self, key: tuple, model: nn.Module) -> None:
        """Take `model` (freshly built, at its initial weights) as the working model of `key`."""
        if key not in self.models:
            self.models[key] = model
            self.templates[key] = {k: v.detach().clone() for k, v in model.state_dict().items()}
            self.loaded[key] = (self.templates[key], None)

    def load(self, key: tuple, weights=None, overlay=None, slot: int = 0) -> nn.Module:
        """The working model of `key` holding `weights` (None: the initial weights), with the
        named entries of `overlay` copied over them. Slots > 0 are more models of the key,
        for clients trained together (runtime.batch_clients)."""
        weights = self.templates[key] if weights is None else weights
        name = key if slot == 0 else (key, slot)
        if name not in self.models:  # another slot: a copy of the key's model
            self.models[name] = copy.deepcopy(self.models[key])
            self.loaded[name] = None
        model, loaded = self.models[name], self.loaded[name]
        if loaded is None or loaded[0] is not weights or loaded[1] is not overlay:
            model.load_state_dict(weights, strict=True)
            if overlay is not None:
                load_tensors(model, overlay)
            self.loaded[name] = (weights, overlay)
        return model

    def share(self, key: tuple, weights: dict, copy: bool = False) -> dict:
        """`weights` with the template's own tensors where they are equal (the template itself
        when all are: a client still at its initial weights costs nothing); the others as
        given, or fresh copies with `copy`."""
        template = self.templates[key]
        shared = {}
        for name, value in weights.items():
            if name in template and torch.equal(value, template[name]):
                shared[name] = template[name]
            else:
                shared[name] = value.detach().clone() if copy else value
        if shared.keys() == template.keys() and all(shared[k] is template[k] for k in shared):
            return template
        return shared

    def touched(self, key: tuple, slot: int = 0) -> None:
        """A step changed the model: its weights no longer equal what was loaded."""
        self.loaded[key if slot == 0 else (key, slot)] = None

    def architectures(self) -> int:
        return len(self.templates)

    def weights(self, key: tuple, model: nn.Module) -> dict[str, torch.Tensor]:
        """Fresh copies of `model`'s state, sharing the template's tensors where equal."""
        return self.share(key, model.state_dict(), copy=True)
