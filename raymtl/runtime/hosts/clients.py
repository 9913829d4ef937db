"""A host's clients: data built on first use, state kept as tensors, a few working models.

Nothing is built for a client before it first takes part (a step or an evaluation): starting
10,000 clients costs their shards' indices only. Then:
- its data is materialised once and cached (`data`);
- what the algorithm keeps between rounds (`Algorithm.keeps`) lives in `ClientStates` as
  tensors, resident up to the host's share of runtime.memory_budget, spilled beyond it;
- each step runs on the working model of the client's architecture (`WorkingModels`), loaded
  with the client's weights before the step and read back after it.
The algorithm still sees `State(model, data, extras)` in every step: which model object it
is, and where the weights were between rounds, is the host's business.

An algorithm that keeps no model (FedAvg) gets the working model at the architecture's
initial weights and loads what its inbox brings; it is evaluated with the model the round's
`evaluation_only` message gave it (`evaluation`), copied into the working model once for all
clients that share it. Clients with weights of their own are evaluated from their kept
tensors as they are (`evaluation_weights`), without copying them into a working model.
"""

from __future__ import annotations

import torch

from raymtl.algorithms.base import State
from raymtl.runtime.hosts.client_state import ClientStates, WorkingModels


class HostedClients:
    """The clients of one host: lazy data, kept state, working models, evaluation models."""

    def __init__(
        self, keeps, init_state, make_data, model_name, budget, spill_root=None, make_many=None
    ):
        self.keeps = tuple(keeps)  # what the algorithm keeps of a client between rounds
        self.init_state = init_state  # (participant, data) -> the algorithm's initial State
        self.make_data = make_data  # participant -> ClientData (materialised from its shard)
        self.make_many = make_many  # participants -> {participant: ClientData}, built together
        self.model_name = model_name  # participant -> the model it trains
        self.data: dict[str, object] = {}
        self.store = ClientStates(budget, spill_root)
        self.working = WorkingModels()
        self.evaluation: dict[str, dict[str, torch.Tensor]] = {}  # the model to evaluate with
        self.every_client: dict[str, torch.Tensor] | None = None  # a copy to every client

    def client_data(self, participant: str):
        if participant not in self.data:
            self.data[participant] = self.make_data(participant)
        return self.data[participant]

    def prepare(self, participants: list[str]) -> None:
        """Build the data of those of `participants` not built yet, together (`make_many`):
        an evaluation of 10,000 clients that never trained decodes their shards at once."""
        missing = [participant for participant in participants if participant not in self.data]
        if len(missing) > 1 and self.make_many is not None:
            self.data.update(self.make_many(missing))

    def key(self, participant: str) -> tuple:
        """Clients of one key share a working model (same architecture and head)."""
        return (self.model_name(participant), self.client_data(participant).num_classes)

    def checkout(self, participant: str, overlay: dict | None = None, slot: int = 0) -> State:
        """The client's state for a step (or, with `overlay` loaded over it, an evaluation)."""
        data, key = self.client_data(participant), self.key(participant)
        if key not in self.working.models or (self.keeps and participant not in self.store):
            self.start(participant, data, key)
        blob = self.store.get(participant) if self.keeps else None
        weights = blob["model"] if blob and blob["model"] is not None else None
        model = self.working.load(key, weights, overlay, slot)
        extras = blob["extras"] if blob else {}
        return State(model=model, data=data, extras=extras)

    def start(self, participant: str, data, key: tuple) -> None:
        """First time the client takes part: the algorithm's init_state, kept as tensors."""
        state = self.init_state(participant, data)
        self.working.adopt(key, state.model)
        if self.keeps:
            self.store.shared.update(id(t) for t in self.working.templates[key].values())
            self.store.put(participant, self.blob(key, state))

    def checkin(self, participant: str, state: State, slot: int = 0) -> None:
        """After a step: keep what the algorithm keeps, as tensors; the model goes back."""
        key = self.key(participant)
        self.working.touched(key, slot)
        self.store.put(participant, self.blob(key, state) if self.keeps else None)

    def blob(self, key: tuple, state: State) -> dict:
        model = None
        if "model" in self.keeps and state.model is not None:
            model = self.working.weights(key, state.model)
        return {"model": model, "extras": state.extras if "extras" in self.keeps else {}}

    def hold_for_evaluation(self, payloads: dict[str, dict], every: dict | None = None) -> None:
        """The evaluation_only messages: the model each client is evaluated with; `every`,
        a copy sent to every client (it replaces the copies held before, and the clients'
        own `payloads` are laid over it)."""
        if every is not None:
            self.evaluation, self.every_client = {}, every
        self.evaluation.update(payloads)

    def evaluation_copy(self, participant: str) -> dict | None:
        """The evaluation copy the client holds: its own, else the one to every client."""
        return self.evaluation.get(participant, self.every_client)

    def evaluation_state(self, participant: str) -> State:
        return self.checkout(participant, overlay=self.evaluation_copy(participant))

    def evaluation_weights(self, participant: str) -> tuple[torch.nn.Module, dict]:
        """The working model of the client's architecture and, without loading them into
        it, the weights `evaluation_state(participant).model` would hold: its kept weights
        (or the initial ones) with the round's evaluation copy over them, as
        `WorkingModels.load` does (the copy cast to each entry's dtype and device)."""
        data, key = self.client_data(participant), self.key(participant)
        if key not in self.working.models or (self.keeps and participant not in self.store):
            self.start(participant, data, key)
        blob = self.store.get(participant) if self.keeps else None
        weights = self.working.templates[key]
        if blob and blob["model"] is not None:
            weights = blob["model"]
        overlay = self.evaluation_copy(participant)
        if overlay is not None:
            weights = weights | {
                name: value.to(dtype=weights[name].dtype, device=weights[name].device)
                for name, value in overlay.items()
            }
        return self.working.models[key], weights

    def evaluated_with(self, participant: str) -> tuple | None:
        """What the client is evaluated with, by identity: (key, its kept weights, the
        round's evaluation copy). Clients of one identity are evaluated with one model (a
        FedAvg round's global model). None when it cannot be told without building or
        reading the client back (not started yet, or spilled): it is evaluated on its own."""
        key = self.key(participant)
        if key not in self.working.templates:
            return None
        weights = self.working.templates[key]
        if "model" in self.keeps:
            if participant not in self.store.resident:
                return None
            kept = self.store.resident[participant]["model"]
            weights = weights if kept is None else kept
        return key, id(weights), id(self.evaluation_copy(participant))

    # -- checkpoints: each started client's blob; a model still at the initial weights is
    # saved as a flag, not as a copy of them
    def saved_blobs(self):
        templates = {id(t) for t in self.working.templates.values()}
        for participant in list(self.store.resident) + list(self.store.spilled):
            blob = self.store.peek(participant)
            if id(blob["model"]) in templates:
                blob = {"model": None, "extras": blob["extras"], "initial_model": True}
            yield participant, blob

    def restore(self, participant: str, blob: dict) -> None:
        """A checkpointed client (files written before clients were kept as tensors hold a
        whole state_dict: it is taken as the model's weights)."""
        key = self.key(participant)
        if key not in self.working.models:
            self.start(participant, self.client_data(participant), key)
        model = blob.get("model") if "model" in self.keeps else None
        if "model" in self.keeps and blob.get("initial_model"):
            model = self.working.templates[key]
        elif model is not None:
            model = self.working.share(key, model)
        extras = (blob.get("extras") or {}) if "extras" in self.keeps else {}
        self.store.put(participant, {"model": model, "extras": extras} if self.keeps else None)

    def report(self) -> dict:
        return self.store.report() | {"working_models": self.working.architectures()}

    def close(self) -> None:
        self.store.close()


def state_budget(config, spec) -> float:
    """A host's share of runtime.memory_budget for its clients' kept state (by clients)."""
    budget = config.runtime.memory_budget_bytes
    mine = sum(p.startswith("client/") for p in spec.participants)
    if budget is None or not mine:
        return float("inf")
    return budget * mine / spec.federation.num_clients
