"""A host: the participants one process (or actor) keeps resident, and their steps.

`ParticipantHost` is the whole per-actor logic. The InlineExecutor calls it
directly; the Ray actors in `actors.py` are this class with Ray's object store
plugged into `put`/`get`. One implementation is what makes the two executors
give identical results.
"""

from __future__ import annotations

import contextlib
import io
import logging
from dataclasses import dataclass

import torch

from raymtl.algorithms.base import (
    Federation,
    Phase,
    State,
    StepContext,
    index_of,
    payload_bits,
    role_of,
)
from raymtl.algorithms.base import Message as AlgorithmMessage
from raymtl.algorithms.registry import get_algorithm
from raymtl.algorithms.training import derive_seed, evaluate
from raymtl.config import ExperimentConfig
from raymtl.models.registry import num_params
from raymtl.runtime.checkpoints import checkpoint_dir, checkpoint_file
from raymtl.runtime.router import Envelope
from raymtl.runtime.storage import Location

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HostSpec:
    """Everything a host needs to build its participants (metadata and indices only)."""

    config: dict  # the resolved ExperimentConfig, as a plain mapping
    federation: Federation
    participants: tuple[str, ...]
    shards: dict  # client participant -> ClientShard (indices into the source)
    seed: int
    torch_threads: int = 1
    device: str = "cpu"
    # The seed's checkpoint root, and the round the driver resumes from (0: the start). The
    # driver decides it from the COMPLETE markers it sees: every host loads that same round.
    checkpoint_root: str | None = None
    resume_round: int = 0
    public: object = None  # data.domains.PublicShard, decoded only if the algorithm uses it


class AlgorithmWarnings(logging.Handler):
    """Collects the warnings algorithm code logs during a step (a rejected non-finite update):
    they become rows of warnings.parquet and lines on the driver's console, not lines lost in
    a worker's log."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def __enter__(self):
        logging.getLogger("raymtl.algorithms").addHandler(self)
        return self

    def __exit__(self, *exc):
        logging.getLogger("raymtl.algorithms").removeHandler(self)


class ParticipantHost:
    """Holds participants' states and runs the algorithm's steps on them."""

    def __init__(self, spec: HostSpec):
        torch.set_num_threads(max(1, spec.torch_threads))
        self.spec = spec
        self.config = ExperimentConfig.model_validate(spec.config)
        algorithm_cls = get_algorithm(self.config.algorithm.name)
        self.algorithm = algorithm_cls(self.config.algorithm.typed_params(), self._build_model)
        self.states: dict[str, State] = {}
        self._public: torch.Tensor | None = None  # the public set, decoded on first use
        for participant in spec.participants:  # a client's model is the one it was given
            self._building = participant
            data = self._client_data(participant)
            self.states[participant] = self.algorithm.init_state(participant, data, spec.federation)
        self._building = None
        if spec.checkpoint_root and spec.resume_round:
            root = Location.of(spec.checkpoint_root)
            self.load(checkpoint_dir(root, spec.resume_round).uri)

    # -- payloads: in-process copies here, Ray's object store in actors.py
    def put(self, tensors: dict[str, torch.Tensor]):
        return {name: t.detach().clone() for name, t in tensors.items()}

    def get(self, payloads: list) -> list[dict[str, torch.Tensor]]:
        return payloads

    def model_name(self, participant: str | None) -> str:
        """The model `participant` trains (clients may differ; other roles: model.name)."""
        models = self.spec.federation.models
        if participant is None or role_of(participant) != "client" or not models:
            return self.config.model.name
        return models[index_of(participant)]

    def _build_model(self, num_classes: int):
        from raymtl.models import build_model

        # Same seed for every participant: all models of one architecture start from one init.
        torch.manual_seed(derive_seed(self.spec.seed, "model-init"))
        name = self.model_name(getattr(self, "_building", None))
        params = self.config.model.params if name == self.config.model.name else {}
        model = build_model(name, self.spec.federation.input_shape, num_classes, **params)
        if self.config.runtime.precision == "bf16-mixed":  # bf16 convolutions run faster NHWC
            model = model.to(memory_format=torch.channels_last)
        return model.to(self.spec.device)

    def _client_data(self, participant: str):
        if role_of(participant) != "client":
            return None
        from raymtl.data import load_pool, materialize

        data_cfg = self.config.data
        shard = self.spec.shards[participant]
        source = shard.source or data_cfg.name
        params = data_cfg.params if source == data_cfg.name else {}
        pool = load_pool(source, data_cfg.root, data_cfg.download, self.spec.seed, **params)
        federation = self.spec.federation
        task = federation.task_specs[shard.task] if federation.task_specs else None
        data = materialize(pool, shard, self.spec.seed, task, federation.input_shape)
        if self.algorithm.uses_public:  # one decoded copy per host, shared by its clients
            data.public_x = self._public_samples()
        if self.spec.device != "cpu":
            for name in ("train_x", "train_y", "test_x", "test_y"):
                setattr(data, name, getattr(data, name).to(self.spec.device))
        return data

    def _public_samples(self) -> torch.Tensor:
        """The public set's images as float tensors of the federation's input shape."""
        if self._public is None:
            from raymtl.data import load_pool
            from raymtl.data.client_data import decode_images

            data_cfg, public = self.config.data, self.spec.public
            params = data_cfg.params if public.source == data_cfg.name else {}
            pool = load_pool(public.source, data_cfg.root, data_cfg.download, self.spec.seed,
                             **params)  # fmt: skip
            images = decode_images(pool, public.indices, self.spec.federation.input_shape)
            self._public = images.to(self.spec.device)
        return self._public

    def run_phase(
        self,
        round_index: int,
        phase: Phase,
        inboxes: dict[str, list[Envelope]],
        sampled: tuple[int, ...],
    ) -> tuple[list[Envelope], list[tuple[str, dict]]]:
        """Run `phase.step` for every participant in `inboxes`.

        Returns their outboxes as envelopes and the metadata rows the steps recorded.
        """
        step = getattr(self.algorithm, phase.step)
        outgoing: list[Envelope] = []
        records: list[tuple[str, dict]] = []
        for participant, envelopes in inboxes.items():
            payloads = self.get([e.payload for e in envelopes])
            inbox = [
                AlgorithmMessage(e.src, e.dst, e.kind, tensors)
                for e, tensors in zip(envelopes, payloads, strict=True)
            ]
            # A payload forwarded unchanged, or sent to several peers, is stored once.
            stored = {id(m.tensors): e.payload for m, e in zip(inbox, envelopes, strict=True)}
            ctx = StepContext(
                me=participant,
                round=round_index,
                rounds=self.config.rounds,
                seed=self.spec.seed,
                sampled=sampled,
                federation=self.spec.federation,
            )
            with AlgorithmWarnings() as warned, self.precision(participant):
                state, outbox = step(self.states[participant], inbox, ctx)
            ctx.records.extend(
                ("warnings", {"participant": participant, "step": phase.step, "message": text})
                for text in warned.messages
            )
            self.states[participant] = state
            for message in outbox:
                if id(message.tensors) not in stored:
                    stored[id(message.tensors)] = self.put(message.tensors)
                bits = payload_bits(message.tensors)
                payload = stored[id(message.tensors)]
                outgoing.append(Envelope(message.src, message.dst, message.kind, bits, payload,
                                         message.evaluation_only))  # fmt: skip
            records += ctx.records
        return outgoing, records

    def evaluate(self) -> list[dict]:
        """Loss and the task's metrics of every hosted client on its own test split."""
        rows = []
        for participant, state in self.states.items():
            if role_of(participant) != "client":
                continue
            data, shard = state.data, self.spec.shards[participant]
            model = self.algorithm.eval_model(state)
            with self.precision(participant):
                metrics = evaluate(model, data.test_x, data.test_y, data.task)
            rows.append(
                {
                    "client": shard.client_id,
                    **metrics,
                    "samples": len(data.train_y),
                    "test_samples": len(data.test_y),
                    "group": shard.group,
                    "task": shard.task,
                    "task_name": data.task.name if data.task else "label",
                    "model": self.model_name(participant),
                    "model_params": num_params(model),
                }
            )
        return rows

    def precision(self, participant: str):
        """runtime.precision for a client's steps and evaluation (Lightning's names): under
        bf16-mixed, matmuls and convolutions run in bfloat16 while weights, optimiser state
        and every other role's maths (aggregation, HCA, graphs) stay in float32."""
        if self.config.runtime.precision != "bf16-mixed" or role_of(participant) != "client":
            return contextlib.nullcontext()
        device = "cuda" if self.spec.device.startswith("cuda") else "cpu"
        # No cast cache: a step runs many optimiser steps inside this one context, and cached
        # bfloat16 copies of the weights would freeze them at their first value.
        return torch.autocast(device_type=device, dtype=torch.bfloat16, cache_enabled=False)

    def rehost(self) -> bool:
        """This host replaces one that was lost: the algorithm takes its roles over."""
        for participant, state in self.states.items():
            self.states[participant] = self.algorithm.rehost(participant, state)
        return True

    def save(self, directory: str) -> None:
        """Write each hosted participant's state (model + extras) under `directory` (a path or
        a URI: this host writes its own files, on whatever node it runs)."""
        folder = Location.of(directory)
        for participant, state in self.states.items():
            blob = {
                "model": state.model.state_dict() if state.model is not None else None,
                "extras": state.extras,
            }
            buffer = io.BytesIO()
            torch.save(blob, buffer)
            checkpoint_file(folder, participant).write_bytes(buffer.getvalue())

    def load(self, directory: str) -> None:
        """Restore hosted participants from a checkpoint folder (data is rebuilt)."""
        folder = Location.of(directory)
        for participant, state in self.states.items():
            location = checkpoint_file(folder, participant)
            if not location.is_file():  # never silently start from the initial model
                raise FileNotFoundError(
                    f"output.dir: checkpoint file {location} is not visible on node "
                    f"{self.node()} (output.dir must be storage every node shares)"
                )
            blob = torch.load(
                io.BytesIO(location.read_bytes()),
                map_location=self.spec.device,
                weights_only=True,  # tensors and plain data only: a file cannot run code
            )
            if blob["model"] is not None:
                state.model.load_state_dict(blob["model"])
            state.extras = blob["extras"]

    def ping(self) -> bool:
        return True

    def node(self) -> str:
        """The node this host runs on (Ray's node id; 'local' in process)."""
        return "local"

    def probe(self, directory: str, name: str) -> bool:
        """Write `<directory>/<name>` and say whether the driver's marker `driver` is there:
        the driver checks it sees every host's file (a shared output.dir)."""
        folder = Location.of(directory)
        folder.child(name).write_text(self.node())
        return folder.child("driver").is_file()

    def peak_memory(self) -> int:
        """The peak resident memory of this host's process so far, in bytes (Linux: KiB)."""
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
