"""What every algorithm is made of: messages, phases, state and the hook set.

A round is an ordered list of `Phase`s. A phase names a role (client, server,
lps, graph, leader), the algorithm method to run (`step(state, inbox, ctx) ->
(state, outbox)`) and which participants of that role run it. The runtime runs
the phases in order, in parallel across participants, and routes every outbox
message to its destination's inbox. Algorithms never see Ray: the same methods
run in one process (InlineExecutor) or in actors (RayExecutor).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, get_args

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from raymtl.tasks.spec import TaskSpec
from raymtl.toolbox.settings import Toolbox

Role = Literal["client", "server", "lps", "graph", "leader"]
SERVER = "server"


def client_name(index: int) -> str:
    """The participant name of client `index` (message src/dst).

    Args:
        index: the client's index, 0..num_clients-1.

    Returns:
        "client/<index>".
    """
    return f"client/{index}"


def lps_name(index: int) -> str:
    """The participant name of local parameter server `index`."""
    return f"lps/{index}"


def leader_name(group: int) -> str:
    """The participant name of the task leader of task group `group` (ColNet)."""
    return f"leader/{group}"


# The destination of a message to every client: an evaluation copy sent once, whatever N
# (`Message(SERVER, EVERY_CLIENT, kind, tensors, evaluation_only=True)`); a later copy to one
# client replaces it for that client.
EVERY_CLIENT = "client/*"


def role_of(participant: str) -> str:
    """'client/3' -> 'client'; 'server' -> 'server'."""
    return participant.split("/", 1)[0]


def index_of(participant: str) -> int:
    """'client/3' -> 3; roles with a single participant -> 0.

    Args:
        participant: a participant name ("client/3", "lps/0", "server").

    Returns:
        The index after the slash; 0 for a name without one.
    """
    _, _, index = participant.partition("/")
    return int(index) if index else 0


@dataclass(frozen=True)
class Message:
    """Everything that crosses a role boundary: tensors from `src` to `dst`."""

    src: str
    dst: str
    kind: str
    tensors: dict[str, torch.Tensor]
    # A copy sent only so that a client that did not take part this round is evaluated with
    # the model it would receive: delivered, but not traffic (never counted in the bits);
    # to every client at once with dst EVERY_CLIENT. The hosts get it in rounds whose
    # evaluation is due only (the latest copy per client waits until then).
    evaluation_only: bool = False


def payload_bits(tensors: dict[str, torch.Tensor]) -> int:
    """Bits on the wire: sum of numel x bits of the dtype."""
    return sum(t.numel() * t.element_size() * 8 for t in tensors.values())


@dataclass(frozen=True)
class Phase:
    """One step of a round: `role` participants run `step`.

    who: "all" participants of the role, the round's "sampled" clients, or only
    those with messages waiting ("inbox").
    trains: the step is the clients' local training (rounds.parquet counts its seconds and
    FLOPs as training, and its clients as trained).
    batched: a method that runs the step for several clients of one architecture at once,
    `batched(states, inboxes, contexts) -> [(state, outbox), ...]`, used under
    runtime.batch_clients > 1 (see `Algorithm.batched_step`); None: client by client.
    """

    role: str
    step: str
    who: Literal["all", "sampled", "inbox"] = "all"
    trains: bool = False
    batched: str | None = None


@dataclass
class State:
    """A participant's resident state: it never leaves its host.

    `data` is the client's private dataset (None for servers); `extras` holds
    algorithm-specific tensors and small values (all saved in checkpoints).
    """

    model: nn.Module | None = None
    data: Any = None
    extras: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class FederationInfo:
    """The static shape of a federation, known to every host.

    Metadata only (counts, graph weights, assignments): no samples, no tensors.
    """

    num_clients: int
    samples: tuple[int, ...]  # train samples n_i per client
    num_classes: tuple[int, ...]  # classes of each client's task
    input_shape: tuple[int, int, int]
    mixing: dict[int, dict[int, float]] | None = None  # peer graph weights, self included
    lps_of_client: tuple[int, ...] | None = None
    num_lps: int = 0
    tasks: tuple[int, ...] = ()  # task (group) of each client: index into task_specs
    groups: tuple[int, ...] = ()  # rotation/mask group of each client
    task_specs: tuple[TaskSpec, ...] = ()  # what each task learns (targets, loss, head, ...)
    models: tuple[str, ...] = ()  # the model (registry name) each client trains; () = one for all
    public_size: int = 0  # samples of the public set (data.public); its indices stay with hosts

    def neighbours(self, client: int) -> list[int]:
        """Peers of `client` in the communication graph (self excluded).

        Args:
            client: a client's index.

        Returns:
            The indices of its peers in `mixing`, sorted.
        """
        assert self.mixing is not None, "this federation has no peer graph"
        return sorted(j for j in self.mixing[client] if j != client)

    def members(self, task: int) -> list[int]:
        """The clients of task group `task`, in index order.

        Args:
            task: a task group, an index into `task_specs`.

        Returns:
            The indices of the clients whose task is `task`.
        """
        return [i for i, t in enumerate(self.tasks) if t == task]

    def task_kinds(self) -> tuple[int, ...]:
        """Per client, an id of its task's kind (targets, loss, head size): clients of equal
        kinds can average whole models, whatever their task ids say.

        Returns:
            One id per client, numbered 0, 1, ... in order of first appearance; all 0 when
            the federation has one task.
        """
        if not self.tasks or not self.task_specs:
            return (0,) * self.num_clients
        kinds = [spec.kind() for spec in self.task_specs]
        ids = {kind: k for k, kind in enumerate(dict.fromkeys(kinds))}
        return tuple(ids[kinds[t]] for t in self.tasks)

    def task_groups(self) -> list[int]:
        """The task groups present, in index order.

        Returns:
            The distinct values of `tasks`, sorted.
        """
        return sorted(set(self.tasks))

    def clients_of_lps(self, lps: int) -> list[int]:
        """Clients assigned to local parameter server `lps`.

        Args:
            lps: the index of a local parameter server ("lps/<lps>").

        Returns:
            The indices of its clients, in index order.
        """
        assert self.lps_of_client is not None, "this federation has no LPS"
        return [i for i, k in enumerate(self.lps_of_client) if k == lps]


@dataclass(frozen=True)
class StepContext:
    """What a step may know about the round besides its own state and inbox."""

    me: str
    round: int
    rounds: int
    seed: int
    sampled: tuple[int, ...]
    federation: FederationInfo
    # Whether the clients are evaluated after this round (every `eval_every` rounds and the
    # last): a step that sends models only for the evaluation skips them otherwise.
    evaluated: bool = True
    records: list[tuple[str, dict]] = field(default_factory=list)
    # Roles held by a client this round (a ColNet task leader): participant -> client.
    holders: dict[str, int] = field(default_factory=dict)
    # The experiment's aggregation rule, server optimiser, privacy, compression and attack
    # (docs/ALGORITHMS.md §9): `aggregate.combine` and `aggregate.server_update` read it.
    toolbox: Toolbox = field(default_factory=Toolbox)

    @property
    def index(self) -> int:
        return index_of(self.me)

    def record(self, table: str, **row) -> None:
        """Log a metadata row to `<table>.parquet` of the run (seed and round are added).

        Args:
            table: the table's name (the file `<table>.parquet` of the run).
            **row: the row's columns and values.
        """
        self.records.append((table, row))

    def report(self, **scalars: float | int | bool) -> None:
        """Report scalars of this step (a step's τ, an update norm, a clip flag) to the run's
        `step_metrics.parquet`, one row per call with the participant and the step's round
        (Flower's fit metrics): `Results.tables["step_metrics"]` reads them.

        Args:
            **scalars: the row's columns, name -> number or flag.
        """
        self.records.append(("step_metrics", {"participant": self.me, **scalars}))

    def held_by(self, client: int) -> None:
        """This round, the role running this step is held by `client`: its traffic is that
        client's in the bit accounting (a task leader is a client with an extra duty).

        Args:
            client: the index of the client holding the role.
        """
        self.holders[self.me] = int(client)


class Params(BaseModel):
    """Base of every algorithm's typed, frozen hyperparameters: what the runtime reads of
    every algorithm (`sample_fraction`: the "sampled" clients of a round)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    sample_fraction: float = Field(
        1.0, gt=0, le=1, description="fraction m of clients sampled per round"
    )


class LocalTrainingParams(Params):
    """Local SGD shared by most algorithms."""

    epochs: int = Field(1, ge=1, description="local epochs per round (E)")
    lr: float = Field(0.05, gt=0, description="local SGD learning rate")
    batch_size: int = Field(32, ge=1, description="local mini-batch size")
    momentum: float = Field(0.0, ge=0, lt=1, description="SGD momentum (state reset every round)")
    weight_decay: float = Field(0.0, ge=0, description="L2 weight decay")
    clip_grad: float | None = Field(None, gt=0, description="max gradient norm; null = off")


# Allowed values of Algorithm's class attributes and of a Phase's role and `who`
# (registry.check_contract refuses anything else).
SHAPES = ("star", "peer", "hierarchical", "none", "groups")
ROLES: tuple[str, ...] = get_args(Role)
TASK_SUPPORT = ("same", "labels", "different")
MODEL_SUPPORT = ("same", "different")
KEEPS = ("model", "extras")
WHO = ("all", "sampled", "inbox")  # Phase.who
# What of the experiment's toolbox (docs/ALGORITHMS.md §9) an algorithm may honour
# (`Algorithm.toolbox`): see there.
TOOLBOX_PARTS = ("aggregation", "server_optimizer", "privacy", "uplink")

ModelFactory = Callable[[str, int], nn.Module]


class Algorithm:
    """The contract between an algorithm and the runtime: class attributes and hooks.

    A subclass declares `name` and `phases`, and defines every step its phases name. A step
    is a method `step(state, inbox: list[Message], ctx: StepContext) -> (state, outbox)`;
    the runtime runs the phases of a round in order and routes each outbox message to its
    destination's inbox. Every other hook below has a default that suits most algorithms;
    the runtime calls them and never probes for a method with `hasattr`.

    A step, `def train(self, state, inbox, ctx)` for a phase `Phase("client", "train")`:

        Args:
            state: the participant's resident `State` (its model, data and extras).
            inbox: the messages delivered to it since its role last ran.
            ctx: the round, the participant (`ctx.me`), the federation and the toolbox.

        Returns:
            `(state, outbox)`: its new state and the `Message`s it sends.
    `raymtl.algorithms.registry.check_contract` checks a class against this contract when
    it is registered. The maths of the built-in algorithms is in docs/ALGORITHMS.md.

    Class attributes (allowed values):
      name            the registry name, used as `algorithm.name` in experiment files
                      (required; unique).
      summary         one line shown by `raymtl list`.
      Params          the typed hyperparameters: a subclass of `Params` (most take
                      `LocalTrainingParams`, local SGD); `algorithm.params` is validated by it.
      shapes          the topologies it runs on, the first one being the default: any of
                      "star" (a server), "peer" (a peer graph: `FederationInfo.mixing`),
                      "hierarchical" (a server over local parameter servers "lps/<k>"),
                      "groups" (task groups, no server) and "none" (no communication).
      uses_graph      True: a "graph" participant (CPU only) runs this algorithm's graph steps.
      uses_leaders    True: one "leader/<g>" participant per task group; a client holds it
                      (`StepContext.held_by`) and its traffic is charged to that client.
      task_support    what tasks the clients may have: "same" (one task of any kind: whole
                      models are averaged), "labels" (one classification task: the update
                      uses class labels) or "different" (only a shared backbone travels:
                      heads, losses and optimisers may differ per task).
      model_support   "same": every client trains one architecture (tensors are averaged by
                      name and shape); "different": clients' models may differ.
      uses_public     True: clients get the public set (`data.public`) as `data.public_x`.
      keeps           what of a client's `State` persists between rounds: a tuple of
                      "model" (its weights) and/or "extras". The host keeps only that, as
                      tensors, and runs steps on a shared working model. Without "model", a
                      step starts from the model's initial weights (load what the inbox
                      brings) and the client is evaluated over its round's evaluation_only
                      message. An instance may set its own (FedAvg with `local_layers` keeps
                      the model); the host reads the instance's, and adds "extras" where the
                      toolbox keeps client state (error-feedback residuals, DP-SGD steps).
      memory_knobs    for an algorithm whose `persistent_bytes` can refuse a run: the
                      settings that shrink the state, quoted in the refusal.
      toolbox         which of the experiment's toolbox sections (docs/ALGORITHMS.md §9) its
                      steps honour, any of: "aggregation" (its averaging steps call
                      `aggregate.combine`), "server_optimizer" (its server calls
                      `aggregate.server_update`), "privacy" (its server combines the sampled
                      clients' models with `combine(..., reference=w_t)`: central DP) and
                      "uplink" (its clients send models up to a server or LPS in messages of
                      `uplink_kinds`: the hosts compress and attack those). A section set in
                      the experiment that the algorithm does not honour is refused.
      combines_otherwise  why it has no aggregation rule, when it combines models otherwise
                      (HCA, a Laplacian or sheaf step, graph-weighted mixing): quoted when a
                      rule, server optimiser or DP is refused for it.
      toolbox_refusals  per toolbox part it does not honour, why (quoted in the refusal):
                      e.g. {"privacy": "its control variates travel un-noised"}.
      uplink_kinds    the kinds of the messages a client sends up that carry a whole model
                      or part of it (names as the model's state_dict), for "uplink".
      inputs          the kinds of samples its steps make sense on (Pool.inputs: "images",
                      "vectors", "tokens"), with `input_refusal` saying why not the others.
    """

    name: ClassVar[str]
    summary: ClassVar[str] = ""
    Params: ClassVar[type[Params]] = LocalTrainingParams
    shapes: ClassVar[tuple[str, ...]] = ("star",)
    uses_graph: ClassVar[bool] = False
    uses_leaders: ClassVar[bool] = False
    task_support: ClassVar[str] = "same"
    model_support: ClassVar[str] = "same"
    uses_public: ClassVar[bool] = False
    keeps: ClassVar[tuple[str, ...]] = ("model", "extras")
    memory_knobs: ClassVar[str] = ""
    toolbox: ClassVar[tuple[str, ...]] = ()
    combines_otherwise: ClassVar[str] = ""
    toolbox_refusals: ClassVar[dict[str, str]] = {}
    uplink_kinds: ClassVar[tuple[str, ...]] = ("model",)
    inputs: ClassVar[tuple[str, ...]] = ("images", "vectors", "tokens")
    input_refusal: ClassVar[str] = ""

    def __init__(self, params: Params, model_factory: ModelFactory | None):
        """Keep the settings; a subclass that overrides it calls `super().__init__` first.

        Args:
            params: the validated `algorithm.params`, an instance of the class's `Params`.
            model_factory: `(participant, num_classes) -> nn.Module`, the seeded model a
                participant trains; None where no model is ever built (the driver, the
                resource checks).
        """
        self.params = params
        # (participant, num_classes) -> the seeded model that participant trains (clients
        # may train different architectures; other roles get `model.name`). None where no
        # model is ever built (the driver, the resource checks).
        self.model_factory = model_factory

    def phases(self, round_index: int, rounds: int) -> list[Phase]:
        """The ordered phases of round `round_index` (1-based) of `rounds`. Required.

        Each `Phase(role, step, who)` names a method of this class; `who` is "all"
        participants of the role, the round's "sampled" clients, or those with an "inbox".

        Args:
            round_index: the round, 1-based.
            rounds: the number of rounds of the run.

        Returns:
            The round's phases, in the order they run.

        Raises:
            NotImplementedError: the base class's; every subclass defines it.
        """
        raise NotImplementedError(f"{type(self).__name__} does not define phases()")

    def init_state(self, participant: str, data: Any, federation: FederationInfo) -> State:
        """The initial state of `participant` ("client/3", "server", "lps/0", ...).

        Default: a client gets its model from the factory and its private `data`
        (`data.num_classes` outputs); any other role starts empty.

        Args:
            participant: the participant's name.
            data: a client's private data (`ClientData`); None for other roles.
            federation: the static shape of the federation.

        Returns:
            The participant's state before its first step.
        """
        if role_of(participant) == "client":
            return State(model=self.model_factory(participant, data.num_classes), data=data)
        return State()

    def eval_model(self, state: State) -> nn.Module:
        """The model a client is evaluated with after each round. Default: `state.model`
        (pFedMe evaluates its personal model instead). An algorithm that overrides it
        (`evaluates_its_own_model`) has every client evaluated alone, with the model it
        returns; otherwise clients that hold the same weights are evaluated together.

        Args:
            state: the client's state after the round.

        Returns:
            The model to evaluate on the client's test split.
        """
        return state.model

    @classmethod
    def evaluates_its_own_model(cls) -> bool:
        """Whether `eval_model` is overridden (see there): True for Ditto, pFedMe and
        Per-FedAvg, which evaluate a personal or adapted model.

        Returns:
            True when a subclass defines `eval_model`.
        """
        return defining_class(cls, "eval_model") is not Algorithm

    def batched_step(self, phase: Phase) -> str | None:
        """The method that runs `phase` for several clients at once (runtime.batch_clients
        > 1), or None: its clients run one by one. Its results must equal the step's.

        Default: `phase.batched`, where the class that defines it is the class that defines
        `phase.step` or a subclass of it: a subclass that changes the step alone (FedProx's
        `train`, under FedAvg's phases) runs it client by client, never its parent's
        batched method.

        Args:
            phase: a client phase of this algorithm.

        Returns:
            The name of the batched method, or None.
        """
        if phase.batched is None:
            return None
        step_owner = defining_class(type(self), phase.step)
        batched_owner = defining_class(type(self), phase.batched)
        if step_owner is None or batched_owner is None:
            return None
        return phase.batched if issubclass(batched_owner, step_owner) else None

    def state_size(self, model: nn.Module) -> int:
        """d_i: the size of a client's state as `persistent_bytes` counts it.
        Default: the model's number of parameters.

        Args:
            model: a client's model.

        Returns:
            d_i, in numbers (not bytes).
        """
        return sum(parameter.numel() for parameter in model.parameters())

    def persistent_bytes(self, dims: list[int], federation: FederationInfo) -> list[int] | None:
        """Bytes each client keeps beyond its model, from every client's `state_size`
        (`dims`): the runtime adds them up per host and refuses a run over
        runtime.memory_budget before any actor starts (naming `memory_knobs`).

        Default None: nothing beyond the model, and the runtime skips the check.

        Args:
            dims: every client's `state_size`, in client order.
            federation: the static shape of the federation.

        Returns:
            Per client, the bytes it keeps beyond its model; or None.
        """
        return None

    def check_resources(self, federation: FederationInfo, memory_budget: float) -> None:
        """Refuse (a one-line ValueError naming the setting to change) a federation whose
        messages or server state would not fit; called before any actor starts, with the
        run's memory budget in bytes. Default: accept.

        Args:
            federation: the static shape of the federation.
            memory_budget: runtime.memory_budget, in bytes.

        Raises:
            ValueError: one line naming the setting to change, where it does not fit.
        """

    def uplink_reference(self, message: Message, inbox: list[Message]) -> dict | None:
        """For "uplink" (`toolbox`): the tensors a client's update in `message` is taken
        against — what it started from this round, which its aggregator holds too. Default
        None: the tensors of the same names in its step's `inbox`, else its model before
        the step (runtime/hosts/uplink.py). IFCA names the cluster model it picked.

        Args:
            message: a message of `uplink_kinds` a client sends up.
            inbox: the inbox of the step that sent it.

        Returns:
            The reference tensors by name, or None for the default.
        """
        return None

    def rehost(self, participant: str, state: State) -> State:
        """`participant` restarts on a new host after its host was lost; `state` is its
        fresh `init_state`. Default: unchanged. ColNet's task leaders pass the role to
        the next member of the group.

        Args:
            participant: the participant's name.
            state: its fresh `init_state`.

        Returns:
            The state it restarts with.
        """
        return state


def defining_class(cls: type, attribute: str) -> type | None:
    """The class of `cls`'s method resolution order whose own namespace defines `attribute`."""
    return next((owner for owner in cls.__mro__ if attribute in vars(owner)), None)
