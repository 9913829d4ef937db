"""A host: the participants one process (or actor) keeps resident, and their steps.

`ParticipantHost` is the whole per-actor logic. The InlineExecutor calls it
directly; the Ray actors in `runtime/actors/classes.py` are this class with Ray's object store
plugged into `put`/`get`. One implementation is what makes the two executors
give identical results.
"""

from __future__ import annotations

import contextlib
import gc
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from raymtl.algorithms.base import (
    FederationInfo,
    Phase,
    State,
    StepContext,
    payload_bits,
    role_of,
)
from raymtl.algorithms.base import Message as AlgorithmMessage
from raymtl.algorithms.registry import build_algorithm
from raymtl.config import ExperimentConfig
from raymtl.errors import StepFailed, step_raised
from raymtl.flops import FlopMeter, paused, warm_up_counting
from raymtl.models.registry import num_params
from raymtl.plugins import load_plugins
from raymtl.runtime.hosts.clients import HostedClients, state_budget
from raymtl.runtime.hosts.compute import (
    deterministic,
    float32_on_the_wire,
    precision,
    warm_up,
)
from raymtl.runtime.hosts.host_data import HostData, HostModels, client_row
from raymtl.runtime.hosts.step_warnings import AlgorithmWarnings
from raymtl.runtime.hosts.uplink import Uplink, reference_of
from raymtl.runtime.results import PhaseResult
from raymtl.runtime.router import Envelope
from raymtl.runtime.storage.checkpoints import (
    checkpoint_dir,
    read_host_checkpoint,
    write_host_checkpoint,
)
from raymtl.runtime.storage.location import Location
from raymtl.tasks.objectives import evaluate_stacked, evaluate_together, stacked_rows
from raymtl.toolbox.sample_level import sample_level

# A client's DP-SGD history in its extras: sampling rate -> steps run (privacy.sample_level)
SAMPLE_STEPS = "sample_level_steps"

# Clients with their own weights are evaluated together per architecture, at most this many
# at once: the stacked copy of their weights is what a chunk costs in memory.
OWN_CHUNK = 32


@dataclass(frozen=True)
class HostSpec:
    """Everything a host needs to build its participants (metadata and indices only)."""

    config: ExperimentConfig  # validated once, by the driver: hosts never validate it again
    federation: FederationInfo
    participants: tuple[str, ...]
    shards: Mapping  # client participant -> ClientShard (a data.shards.ShardTable)
    seed: int
    torch_threads: int = 1
    device: str = "cpu"
    # The seed's checkpoint root, and the round the driver resumes from (0: the start). The
    # driver decides it from the COMPLETE markers it sees: every host loads that same round.
    checkpoint_root: str | None = None
    resume_round: int = 0
    public: object = None  # data.domains.PublicShard, decoded only if the algorithm uses it
    pools: dict | None = None  # source -> the decoded pool in Ray's object store (a ref)
    # Folders the driver imported plugins from (raymtl.plugins.search_paths): a host imports
    # `config.plugins` from them before it builds anything.
    plugin_paths: tuple[str, ...] = ()
    name: str = ""  # the host's name in the layout (clients-0, server, lps-1)


class ParticipantHost:
    """Holds participants' states and runs the algorithm's steps on them.

    Made in two calls: the constructor keeps the spec only, `build` builds everything. An
    error in `build` (a plugin that does not import, data missing on this node) is then an
    answer to that call, reported as such, and not the death of a host.
    """

    def __init__(self, spec: HostSpec):
        self.spec = spec
        self.clients: HostedClients | None = None  # built by `build`

    def build(self) -> dict[str, float]:
        """Import the plugins, then build the algorithm, the data and the participants (and
        load the checkpoint the driver resumes from). Returns where the seconds went
        (`setup_s`: plugins, algorithm, data pools and participants; `checkpoint_s`;
        `warm_up_s`): the run's startup.parquet."""
        began = time.perf_counter()
        spec = self.spec
        self.config = spec.config
        load_plugins(self.config.plugins, spec.plugin_paths)
        torch.set_num_threads(max(1, spec.torch_threads))
        deterministic(self.config.runtime.deterministic, spec.device)
        self.models = HostModels(self.config, spec)
        self.algorithm = build_algorithm(
            self.config.algorithm.name, self.config.algorithm.typed_params(), self.models.build
        )
        self.flops = FlopMeter()
        self.toolbox = self.config.toolbox()
        self.malicious = malicious_clients(self.config, spec)
        self.uplink = Uplink(self.toolbox, self.algorithm.uplink_kinds, self.malicious)
        flipped = self.malicious if self.toolbox.attack.kind == "label_flip" else frozenset()
        self.data = HostData(self.config, spec, self.algorithm.uses_public, self.pool, flipped)
        keeps = self.algorithm.keeps
        # e_k and a client's DP-SGD history are kept client state
        kept_by_toolbox = self.uplink.keeps_residual or self.toolbox.privacy.sample_level
        if kept_by_toolbox and "extras" not in keeps:
            keeps = (*keeps, "extras")
        # Clients are built on first use (clients.py); other roles are few and kept whole.
        self.clients = HostedClients(
            keeps,
            self._init_client,
            self.data.client,
            self.model_name,
            state_budget(self.config, spec),
            self.config.runtime.spill_dir,
            make_many=self.data.clients,
        )
        self.states: dict[str, State] = {
            p: self.algorithm.init_state(p, None, spec.federation)
            for p in spec.participants
            if role_of(p) != "client"
        }
        built = time.perf_counter()
        if spec.checkpoint_root and spec.resume_round:
            root = Location.of(spec.checkpoint_root)
            self.load(checkpoint_dir(root, spec.resume_round).uri)
        loaded = time.perf_counter()
        self.warm_up()
        return {
            "setup_s": built - began,
            "checkpoint_s": loaded - built,
            "warm_up_s": time.perf_counter() - loaded,
        }

    def warm_up(self) -> None:
        """torch's one-time costs, paid while the host starts, not in round 1: FLOP
        counting's (every host's, coordinators included: a server's first broadcast would pay
        them), then a client's first training step's."""
        warm_up_counting()
        clients = self.client_participants()
        if clients:
            warm_up(self.clients.checkout(clients[0]), self.precision(clients[0]))

    # -- payloads: in-process copies here, Ray's object store in runtime/actors/classes.py
    def put(self, tensors: dict[str, torch.Tensor]):
        return {name: t.detach().clone() for name, t in tensors.items()}

    def get(self, payloads: list) -> list[dict[str, torch.Tensor]]:
        return payloads

    def model_name(self, participant: str | None) -> str:
        return self.models.name_of(participant)

    def _init_client(self, participant: str, data) -> State:
        return self.algorithm.init_state(participant, data, self.spec.federation)

    def pool(self, source: str):
        """A source's decoded pool: the object store's copy under Ray (actors/classes.py)."""
        return self.data.load(source)

    def run_phase(
        self,
        round_index: int,
        phase: Phase,
        inboxes: dict[str, list[Envelope]],
        sampled: tuple[int, ...],
    ) -> PhaseResult:
        """Run `phase.step` for every participant in `inboxes`: their outboxes as envelopes,
        the rows their steps logged, the roles' holders and the warnings they raised."""
        step, result = getattr(self.algorithm, phase.step), PhaseResult()
        for batch in self._batches(phase, inboxes):
            inputs = [self._inputs(p, inboxes[p], round_index, sampled) for p in batch]
            states = [self._checkout(p, slot) for slot, p in enumerate(batch)]
            # What the clients start from, where their uplink is transformed (uplink.py).
            before = [self._before(p, state) for p, state in zip(batch, states, strict=True)]
            inbox_list, contexts = [i for i, _, _ in inputs], [c for _, _, c in inputs]
            private = self._sample_level(phase)
            with AlgorithmWarnings() as warned, self.precision(batch[0]), private as trained:
                try:
                    outputs, flops = self._run_steps(phase, step, states, inbox_list, contexts)
                except Exception as error:  # the algorithm's code: a plugin's, or a bug
                    raise self._step_failed(phase, batch, round_index, error) from error
            if trained:  # one client a batch: DP-SGD trains client by client
                self._account_sample_level(states[0], contexts[0], trained)
            elif phase.trains and self.toolbox.privacy.sample_level is not None:
                warned.messages.append(
                    f"privacy.sample_level: {phase.step} trained without local_sgd: no DP-SGD, "
                    "no sample-level ε"
                )
            result.flops += flops
            who = "+".join(batch)
            result.warnings += [
                {"participant": who, "step": phase.step, "message": text}
                for text in warned.messages
            ]
            for slot, (participant, (inbox, stored, ctx), (state, outbox)) in enumerate(
                zip(batch, inputs, outputs, strict=True)
            ):
                sending = (inbox, before[slot], state.extras, round_index)
                result.envelopes += self._envelopes(outbox, stored, sending)
                self._checkin(participant, state, slot)
                result.tables += ctx.records
                result.holders.update(ctx.holders)
        return result

    def _run_steps(self, phase: Phase, step, states, inboxes, contexts) -> tuple[list, float]:
        """The outputs of one batch's steps, and their FLOPs (raymtl/flops.py): clients'
        model passes as they run, a coordinator's step every time it runs."""
        if phase.role != "client":
            output, flops = self.flops.step(lambda: step(states[0], inboxes[0], contexts[0]))
            return [output], flops
        with self.flops.passes() as counted:
            batched = self._batched(phase)
            if batched is not None:  # clients stepped together (runtime.batch_clients)
                outputs = getattr(self.algorithm, batched)(states, inboxes, contexts)
            else:
                outputs = [step(states[0], inboxes[0], contexts[0])]
        return outputs, counted.flops

    def _step_failed(self, phase: Phase, batch: list[str], round_index: int, error) -> StepFailed:
        """What a step raised, as one line naming the algorithm, its class's method, the
        exception and where it was raised (the step's code, or the built-in code it calls;
        a hook the step called that raised is named too: `errors.step_raised`), with the
        participants, seed and round; the whole traceback goes with it (run.log)."""
        method = self._batched(phase) or phase.step
        context = f"{'+'.join(batch)}, seed {self.spec.seed}, round {round_index}"
        step = step_raised(type(self.algorithm), method, error, context)
        line = f"algorithm {self.config.algorithm.name}: {step}"
        return StepFailed(line, "".join(traceback.format_exception(error)))

    def _batched(self, phase: Phase) -> str | None:
        """Under runtime.batch_clients > 1, the method that runs a client phase's clients
        together (`Algorithm.batched_step`); None: one by one."""
        if phase.role != "client" or self.config.runtime.batch_clients < 2:
            return None
        return self.algorithm.batched_step(phase)

    def _batches(self, phase: Phase, inboxes: dict) -> list[list[str]]:
        """Participants one by one; a batched phase (`_batched`) in groups of up to
        runtime.batch_clients clients of one architecture."""
        if self._batched(phase) is None:
            return [[participant] for participant in inboxes]
        size = self.config.runtime.batch_clients
        by_key: dict[tuple, list[str]] = {}
        for participant in inboxes:
            by_key.setdefault(self.clients.key(participant), []).append(participant)
        return [
            group[k : k + size] for group in by_key.values() for k in range(0, len(group), size)
        ]

    def _inputs(self, participant: str, envelopes: list[Envelope], round_index, sampled):
        """A step's inbox, the stored payloads by tensors' identity, and its context."""
        payloads = self.get([e.payload for e in envelopes])
        encoded = [k for k, e in enumerate(envelopes) if e.reference is not None]
        references = self.get([envelopes[k].reference for k in encoded])
        for k, reference in zip(encoded, references, strict=True):
            payloads[k] = self.uplink.decode(payloads[k], reference)
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
            evaluated=evaluation_due(round_index, self.config),
            toolbox=self.toolbox,
        )
        return inbox, stored, ctx

    def _sample_level(self, phase: Phase):
        """The scope in which a client's local training runs DP-SGD (privacy.sample_level)."""
        settings = self.toolbox.privacy.sample_level if phase.role == "client" else None
        return sample_level(settings)

    def _account_sample_level(self, state: State, ctx: StepContext, trained: list) -> None:
        """A client's sample-level ε so far, from every DP-SGD step it ran (kept in its
        extras: its whole history, so a resumed run goes on counting): a row of
        step_metrics.parquet."""
        from raymtl.toolbox.accounting import sample_level_epsilon

        settings = self.toolbox.privacy.sample_level
        history = state.extras.setdefault(SAMPLE_STEPS, {})
        for steps, samples, batch_size in trained:
            rate = min(1.0, batch_size / max(1, samples))
            history[rate] = history.get(rate, 0) + steps
        # One rate as a rule (a client's samples and batch size are fixed); several compose
        # (a sum of ε's at δ each: an upper bound)
        epsilon = sum(
            sample_level_epsilon(settings.noise_multiplier, rate, steps, settings.delta)
            for rate, steps in history.items()
        )
        ctx.report(sample_epsilon=epsilon, sample_steps=int(sum(history.values())))

    def _before(self, participant: str, state: State) -> dict | None:
        """A client's kept model before its step, where its uplink is transformed and it may
        send what it did not receive this step (uplink.reference_of); else None. A client
        that keeps no model starts from what its inbox brings: nothing to copy."""
        kept = "model" in self.clients.keeps and state.model is not None
        if not (self.uplink.active and kept and role_of(participant) == "client"):
            return None
        # CPU copies, as messages are: the reference may go into the object store
        return {
            name: t.detach().to("cpu", copy=True) for name, t in state.model.state_dict().items()
        }

    def _checkout(self, participant: str, slot: int) -> State:
        if role_of(participant) == "client":
            return self.clients.checkout(participant, slot=slot)
        return self.states[participant]

    def _checkin(self, participant: str, state: State, slot: int) -> None:
        if role_of(participant) == "client":
            self.clients.checkin(participant, state, slot)
        else:
            self.states[participant] = state

    def _envelopes(self, outbox, stored: dict, sending: tuple | None = None) -> list[Envelope]:
        envelopes = []
        for message in outbox:
            if self.config.runtime.precision == "bf16-mixed":
                float32_on_the_wire(message.tensors)
            if sending is not None and self.uplink.applies(message):
                envelopes.append(self._uplink_envelope(message, stored, *sending))
                continue
            if id(message.tensors) not in stored:
                stored[id(message.tensors)] = self.put(message.tensors)
            payload, bits = stored[id(message.tensors)], payload_bits(message.tensors)
            envelopes.append(
                Envelope(
                    message.src, message.dst, message.kind, bits, payload, message.evaluation_only
                )
            )
        return envelopes

    def _uplink_envelope(self, message, stored: dict, inbox, before, extras, round_index):
        """A client's update transformed on its host (uplink.py): attacked, clipped, noised
        and encoded, with the handle of what it is decoded against."""
        names = [n for n, t in message.tensors.items() if t.is_floating_point()]
        reference, index = self.algorithm.uplink_reference(message, inbox), None
        if reference is None:
            reference, index = reference_of(names, inbox, before)
        tensors, bits = self.uplink.transform(
            message, reference, extras, self.spec.seed, round_index
        )
        payload = self.put(tensors)
        if bits is None:  # not encoded: plain tensors, counted as they are
            return Envelope(message.src, message.dst, message.kind, payload_bits(tensors), payload)
        handle = stored.get(id(inbox[index].tensors)) if index is not None else None
        if handle is None:
            handle = self.put({name: reference[name] for name in names if name in reference})
        return Envelope(message.src, message.dst, message.kind, bits, payload, reference=handle)

    def hold_for_evaluation(
        self, payloads: list, owners: dict[str, int], every: int | None = None
    ) -> bool:
        """The evaluation_only messages since the last evaluation: `owners[client]` indexes
        the distinct `payloads`, each fetched once however many clients share it; `every`,
        the copy to EVERY_CLIENT (every hosted client's, unless it has its own)."""
        tensors = self.get(payloads)
        default = tensors[every] if every is not None else None
        self.clients.hold_for_evaluation({p: tensors[k] for p, k in owners.items()}, default)
        return True

    def client_participants(self) -> list[str]:
        if getattr(self, "_clients", None) is None:  # the spec's participants never change
            self._clients = [p for p in self.spec.participants if role_of(p) == "client"]
        return list(self._clients)

    def evaluate(self, participants: list[str] | None = None) -> list[dict]:
        """Loss and the task's metrics of every hosted client (of `participants`, when
        given) on its own test split, and the FLOPs of its evaluation (`flops`), in the
        order of the hosted clients. Clients
        evaluated with one model (`_together`) go through it together; the others, each
        with its own weights, together per architecture (`_evaluate_own`)."""
        hosted = self.client_participants()
        if participants is not None:
            chosen = set(participants)
            hosted = [p for p in hosted if p in chosen]
        participants = hosted
        with collection_paused():
            self.clients.prepare(participants)  # never-built clients' data decoded together
            rows, own = {}, []
            for group in self._together(participants):
                if len(group) > 1:
                    rows.update(zip(group, self._evaluate_group(group), strict=True))
                else:
                    own += group
            rows.update(zip(own, self._evaluate_own(own), strict=True))
        return [rows[participant] for participant in participants]

    def _together(self, participants: list[str]) -> list[list[str]]:
        """Groups of clients evaluated with the same model (clients.evaluated_with); every
        client alone when the algorithm has its own evaluation model (Ditto's personal one,
        Per-FedAvg's adapted one)."""
        if self.algorithm.evaluates_its_own_model():
            return [[participant] for participant in participants]
        groups: dict[object, list[str]] = {}
        for participant in participants:
            identity = self.clients.evaluated_with(participant)
            groups.setdefault(participant if identity is None else identity, []).append(participant)
        return list(groups.values())

    def _evaluate_own(self, participants: list[str]) -> list[dict]:
        """Clients evaluated on their own (`_together`). One whose evaluation weights are
        its architecture's initial ones (with the round's evaluation copy over them, if any:
        FedAvg's global model) is evaluated with a model other clients may share, so it goes
        through `_evaluate_group` alone, as it would with company: its numbers must not
        depend on whether its host holds another client of that model. The others,
        with their own evaluation weights, are taken per architecture (module class; state
        names, shapes and dtypes; the test samples' shape; `stacked_rows`, so that a chunk
        fills evaluate_stacked's chunks of one row count) in chunks of `OWN_CHUNK`, each
        chunk through tasks.objectives.evaluate_stacked, whose numbers for a client do not
        depend on the other clients of its chunk."""
        rows: dict[str, dict] = {}
        pending: dict[tuple, list] = {}
        default_model = not self.algorithm.evaluates_its_own_model()
        for participant in participants:
            identity = self.clients.evaluated_with(participant) if default_model else None
            if identity is not None:
                key, weights_id, _ = identity
                if weights_id == id(self.clients.working.templates[key]):
                    rows[participant] = self._evaluate_group([participant])[0]
                    continue
            skeleton, weights, flops = self._evaluation_model(participant)
            data = self.clients.client_data(participant)
            signature = (
                type(skeleton),
                tuple((name, tuple(t.shape), t.dtype, t.device) for name, t in weights.items()),
                tuple(data.test_x.shape[1:]),
                data.test_x.dtype,
                stacked_rows(len(data.test_y)),
            )
            members = pending.setdefault(signature, [])
            members.append((participant, skeleton, weights, data, flops))
            if len(members) == OWN_CHUNK:
                rows.update(self._evaluate_stacked(pending.pop(signature)))
        for members in pending.values():
            rows.update(self._evaluate_stacked(members))
        return [rows[participant] for participant in participants]

    def _evaluation_model(self, participant: str) -> tuple[torch.nn.Module, dict, float]:
        """A module of the client's evaluation architecture, the weights to evaluate it
        with, and the FLOPs spent finding them (Per-FedAvg's adaptation step)."""
        if not self.algorithm.evaluates_its_own_model():
            return (*self.clients.evaluation_weights(participant), 0.0)
        state = self.clients.evaluation_state(participant)
        with self.precision(participant), self.flops.passes() as counted:
            model = self.algorithm.eval_model(state)
        weights = {name: t.detach() for name, t in model.state_dict().items()}
        if model is state.model:  # the working model: the next client's weights go into it
            weights = {name: t.clone() for name, t in weights.items()}
        return model, weights, counted.flops

    def _evaluate_stacked(self, members: list) -> dict[str, dict]:
        """One chunk of clients of one architecture (`_evaluate_own`): their rows, with the
        FLOPs of one pass per 512 test samples each (`evaluate_task`'s batches; a pass's
        count is linear in its samples, so any batching gives the same total)."""
        skeleton = members[0][1]
        tests = [(data.test_x, data.test_y, data.task) for _, _, _, data, _ in members]
        weights = [weights for _, _, weights, _, _ in members]
        with self.precision(members[0][0]), paused():  # counted by hand below
            results = evaluate_stacked(skeleton, weights, tests)
        size, rows = num_params(skeleton), {}
        for (participant, _, _, data, flops), metrics in zip(members, results, strict=True):
            x = data.test_x
            flops += sum(
                self.flops.pass_flops(skeleton, (x[start : start + 512],), {}, False)
                for start in range(0, len(x), 512)
            )
            rows[participant] = self._row(participant, data, metrics, size, flops)
        return rows

    def _evaluate_group(self, group: list[str]) -> list[dict]:
        """Clients that share their evaluation model: one model, their test sets together
        (tasks.objectives.evaluate_together); FLOPs shared out by test samples."""
        model = self.clients.evaluation_state(group[0]).model
        datas = [self.clients.client_data(participant) for participant in group]
        tests = [(data.test_x, data.test_y, data.task) for data in datas]
        with self.precision(group[0]), self.flops.passes() as counted:
            results = evaluate_together(model, tests)
        samples, size = max(1, sum(len(data.test_y) for data in datas)), num_params(model)
        return [
            self._row(p, data, metrics, size, counted.flops * len(data.test_y) / samples)
            for p, data, metrics in zip(group, datas, results, strict=True)
        ]

    def _row(self, participant: str, data, metrics: dict, size: int, flops: float) -> dict:
        shard, name = self.spec.shards[participant], self.model_name(participant)
        row = client_row(shard, data, metrics, name, size)
        return row | {"flops": flops}  # the round loop sums them up

    def state(self, participant: str) -> dict:
        """A copy of what `participant` keeps between rounds: `{"model": its state_dict (None
        when the algorithm keeps no model of it), "extras": its extras}`, on the CPU."""
        if role_of(participant) == "client":
            state = self.clients.checkout(participant)
            keeps_model = "model" in self.algorithm.keeps
        else:
            state, keeps_model = self.states[participant], True
        model = state.model.state_dict() if keeps_model and state.model is not None else None
        return cpu_copy({"model": model, "extras": state.extras})

    def state_report(self) -> dict:
        """Bytes of clients' kept state resident and spilled, and the working models."""
        return self.clients.report()

    def precision(self, participant: str):
        """runtime.precision for a client's steps and evaluation (compute.precision)."""
        if role_of(participant) != "client":
            return contextlib.nullcontext()
        return precision(self.config.runtime.precision, self.spec.device)

    def rehost(self) -> bool:
        """This host replaces one that was lost: the algorithm takes its roles over."""
        for participant, state in self.states.items():
            self.states[participant] = self.algorithm.rehost(participant, state)
        return True

    def save(self, directory: str) -> dict[str, str]:
        """Write each hosted participant's state (model + extras) under `directory`: every
        coordinator's, and each client's that took part (checkpoints.write_host_checkpoint).
        Returns the sha256 of every file written, by name: the driver's manifest records
        them without reading the files back."""
        coordinators = {
            participant: {
                "model": state.model.state_dict() if state.model is not None else None,
                "extras": state.extras,
            }
            for participant, state in self.states.items()
        }
        clients = self.client_participants()
        return write_host_checkpoint(
            directory,
            coordinators,
            self.clients.saved_blobs() if clients else (),
            clients[0] if clients else None,
        )

    def load(self, directory: str) -> None:
        """Restore hosted participants from a checkpoint folder (data is rebuilt), every file
        checked against the manifest first (a damaged one: checkpoints.DamagedCheckpoint)."""
        coordinators, clients = read_host_checkpoint(
            directory, list(self.states), self.client_participants(), self.spec.device, self.node()
        )
        for participant, blob in coordinators.items():
            state = self.states[participant]
            if blob["model"] is not None:
                state.model.load_state_dict(blob["model"])
            state.extras = blob["extras"]
        for participant, blob in clients.items():
            self.clients.restore(participant, blob)

    def close(self) -> bool:
        """Remove this host's spilled client state (local disk); nothing for a host that was
        never built (its run stopped first)."""
        if self.clients is not None:
            self.clients.close()
        return True

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
        """The peak resident memory of this host's process in bytes: since it started, or
        since a reused actor was released by its last federation (memory.peak_rss)."""
        from raymtl.runtime.hosts.memory import peak_rss

        return peak_rss()


@contextlib.contextmanager
def collection_paused():
    """Python's cyclic garbage collector off inside the block. Evaluating 10,000 clients makes
    ~10 objects each (data views, rows), which sets off full collections of the whole heap
    every few thousand: ~0.25 s each on a host that holds a run; nothing in between makes
    reference cycles worth collecting early (reference counting frees the rest)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def malicious_clients(config: ExperimentConfig, spec: HostSpec) -> frozenset[int]:
    """The seed's malicious clients (attack.fraction of N, drawn once per seed, §9.5)."""
    attack = config.attack
    if attack.is_default():
        return frozenset()
    from raymtl.toolbox.attacks import malicious_clients as drawn

    return frozenset(drawn(spec.federation.num_clients, attack.fraction, spec.seed))


def evaluation_due(round_index: int, config: ExperimentConfig) -> bool:
    """Whether the clients are evaluated after round `round_index` (round_loop.py)."""
    return round_index % config.eval_every == 0 or round_index == config.rounds


def cpu_copy(value):
    """`value` with every tensor inside it (dicts, lists, tuples) copied to the CPU."""
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return {key: cpu_copy(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(cpu_copy(item) for item in value)
    return value
