"""A host's data and models: the decoded pools, each client's tensors, the public set, and
the models it builds (each architecture once, then copies).

Under Ray the driver puts every pool in the object store once per run (`share_pools`): the
actors of a node map that one copy (numpy arrays, zero-copy) instead of each reading and
decoding the dataset again. In process the pools come from `load_pool`'s per-process cache.
A client's float tensors are still built (`materialize`) by its own host, on first use; the
clients first used together (an evaluation of clients that never trained) are built together
(`HostData.clients`: one decode per kind of shard, bit-identical).
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import replace

import numpy as np
import torch

from raymtl.data.sources import Pool


def pool_to_shared(pool: Pool) -> dict:
    """A Pool as numpy arrays plus metadata: what goes into Ray's object store."""
    meta = replace(pool, x=torch.empty(0), y=torch.empty(0))
    return {"x": pool.x.numpy(), "y": pool.y.numpy(), "meta": meta}


def pool_from_shared(shared: dict) -> Pool:
    """The Pool back, its arrays read straight from the object store (no copy)."""
    with warnings.catch_warnings():  # read-only shared memory: samples are only indexed
        warnings.simplefilter("ignore", UserWarning)
        x, y = torch.from_numpy(shared["x"]), torch.from_numpy(np.asarray(shared["y"]))
    return replace(shared["meta"], x=x, y=y)


def cached_factory(build, seed_rng):
    """`build(name, num_classes)` once per architecture, then copies of it.

    The copy leaves the random generator as the build left it, so whatever an algorithm's
    init_state draws next (FedMuscle's projection) is what it would have drawn anyway.
    """
    built: dict[tuple, tuple] = {}

    def factory(name: str, num_classes: int):
        key = (name, num_classes)
        if key not in built:
            seed_rng()
            model = build(name, num_classes)
            built[key] = (copy.deepcopy(model), torch.get_rng_state())
            return model
        model, rng_state = built[key]
        torch.set_rng_state(rng_state)
        return copy.deepcopy(model)

    return factory


class HostModels:
    """The models a host builds: each architecture once (seeded: every participant's model of
    one architecture starts from one init), then copies (`cached_factory`)."""

    def __init__(self, config, spec):
        self.config, self.spec = config, spec
        self.factory = cached_factory(self.new_model, self.seed_init)

    def name_of(self, participant: str | None) -> str:
        """The model `participant` trains (clients may differ; other roles: model.name)."""
        models = self.spec.federation.models
        if participant is None or not participant.startswith("client/") or not models:
            return self.config.model.name
        return models[int(participant.split("/")[1])]

    def build(self, participant: str, num_classes: int):
        """The algorithm's model_factory: the model `participant` trains."""
        return self.factory(self.name_of(participant), num_classes)

    def seed_init(self) -> None:
        from raymtl.algorithms.training import derive_seed

        torch.manual_seed(derive_seed(self.spec.seed, "model-init"))

    def new_model(self, name: str, num_classes: int):
        from raymtl.models import build_model

        params = self.config.model.params if name == self.config.model.name else {}
        model = build_model(name, self.spec.federation.input_shape, num_classes, **params)
        if self.config.runtime.precision == "bf16-mixed":  # bf16 convolutions run faster NHWC
            model = model.to(memory_format=torch.channels_last)
        return model.to(self.spec.device)


class HostData:
    """Builds a hosted client's data from its shard, and the public set once per host."""

    def __init__(self, config, spec, uses_public: bool, pool_of, flip_labels_of=frozenset()):
        self.config, self.spec, self.uses_public = config, spec, uses_public
        self.pool_of = pool_of  # source name -> Pool (object store, or the process cache)
        self._public: torch.Tensor | None = None
        self._pools: dict[str, Pool] = {}
        # Clients whose training labels a label-flip attack turns (attack.kind: label_flip)
        self.flip_labels_of: frozenset[int] = flip_labels_of

    def load(self, source: str) -> Pool:
        from raymtl.data import load_pool

        if source not in self._pools:  # load_pool checks its parameters on every call
            data_cfg = self.config.data
            main = source == data_cfg.name
            params = data_cfg.params if main else {}
            count = data_cfg.num_clients if main else None
            self._pools[source] = load_pool(
                source, data_cfg.root, data_cfg.download, self.spec.seed, count, **params
            )
        return self._pools[source]

    def client(self, participant: str):
        return self.clients([participant])[participant]

    def clients(self, participants: list[str]) -> dict:
        """Each participant's ClientData (`materialize`), built together per source and task
        (`materialize_many`: one decode per kind of shard, the same tensors bit for bit)."""
        from raymtl.data import materialize_many

        federation, kinds = self.spec.federation, {}
        for participant in participants:
            shard = self.spec.shards[participant]
            kinds.setdefault((shard.source or self.config.data.name, shard.task), []).append(
                participant
            )
        built = {}
        for (source, task_id), members in kinds.items():
            task = federation.task_specs[task_id] if federation.task_specs else None
            shards = [self.spec.shards[participant] for participant in members]
            datas = materialize_many(
                self.pool_of(source), shards, self.spec.seed, task, federation.input_shape
            )
            built.update(zip(members, datas, strict=True))
        for participant, data in built.items():
            if int(participant.split("/")[1]) in self.flip_labels_of:
                from raymtl.toolbox.attacks import flip_labels

                # trains honestly on y ↦ C − 1 − y (§9.5); its test labels stay true
                data.train_y = flip_labels(data.train_y, data.num_classes)
            if self.uses_public:  # one decoded copy per host, shared by its clients
                data.public_x = self.public_samples()
            if self.spec.device != "cpu":
                for name in ("train_x", "train_y", "test_x", "test_y"):
                    setattr(data, name, getattr(data, name).to(self.spec.device))
        return built

    def public_samples(self) -> torch.Tensor:
        """The public set's images as float tensors of the federation's input shape."""
        if self._public is None:
            from raymtl.data.client_data import decode_images

            public = self.spec.public
            images = decode_images(
                self.pool_of(public.source), public.indices, self.spec.federation.input_shape
            )
            self._public = images.to(self.spec.device)
        return self._public


def client_row(shard, data, metrics: dict, model: str, model_params: int) -> dict:
    """A client's row of clients.parquet (the driver adds seed, round and bits)."""
    return {
        "client": shard.client_id,
        **metrics,
        "samples": len(data.train_y),
        "test_samples": len(data.test_y),
        "group": shard.group,
        "task": shard.task,
        "task_name": data.task.name if data.task else "label",
        "model": model,
        "model_params": model_params,
    }
