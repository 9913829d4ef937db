"""The experiment: its pydantic models, validation and YAML loading.

Every section forbids unknown keys; cross-field rules (impossible partitions,
too many LPSs, a disconnected graph, a topology the algorithm cannot run on)
are checked here, so a bad file fails before any actor starts, with one line
that names the field (`ConfigError`).

`plugins:` (module names or paths to .py files) are imported before anything else is
validated, so the names they register (algorithms, models, datasets, ...) resolve. A
relative path is looked up next to the experiment file, then in the current folder, and
kept absolute, so every host finds the same file.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from raymtl.algorithms.base import Params
from raymtl.algorithms.registry import algorithm_params, get_algorithm
from raymtl.config.base import Section, first_error, size_in_bytes
from raymtl.config.checks import (
    check_algorithm,
    check_models,
    check_names,
    check_tasks,
    check_topology,
)
from raymtl.config.data import DataConfig
from raymtl.config.overrides import apply_override
from raymtl.config.toolbox_checks import check_toolbox
from raymtl.errors import ConfigError, one_line
from raymtl.graph.topology import STRUCTURED_KINDS
from raymtl.plugins import load_plugins, resolve_entry
from raymtl.toolbox.settings import (
    AggregationSettings,
    AttackSettings,
    CompressionSettings,
    PrivacySettings,
    ServerOptimizerSettings,
    Toolbox,
)


class ModelConfig(Section):
    """One model for every client (`name`, `params`), or models that differ per client."""

    name: str = "cnn_mnist"
    params: dict[str, Any] = Field(default_factory=dict, description="parameters of `name`")
    mix: dict[str, float] | None = Field(
        None, description="model -> share of the clients, dealt seeded (e.g. small_cnn: 0.34)"
    )
    by_task: dict[str, str] | None = Field(None, description="task name -> its clients' model")
    clients: list[str] | None = Field(None, description="the model of every client, in order")

    @model_validator(mode="after")
    def _one_way_to_differ(self) -> ModelConfig:
        given = [f for f in ("mix", "by_task", "clients") if getattr(self, f) is not None]
        if len(given) > 1:
            raise ValueError(f"{given[1]}: give only one of mix, by_task, clients")
        for model, share in (self.mix or {}).items():
            if not share > 0 or share == float("inf"):
                raise ValueError(f"mix: share of '{model}' must be a positive number")
        return self

    def names(self) -> set[str]:
        """Every model name the section mentions."""
        named = {self.name, *(self.mix or {}), *(self.by_task or {}).values()}
        return named | set(self.clients or ())

    def differ(self) -> bool | None:
        """Whether clients train different models (None: by_task, decided at set-up)."""
        if self.mix is not None:
            return len(self.mix) > 1
        if self.clients is not None:
            return len(set(self.clients)) > 1
        return None if self.by_task else False


class AlgorithmConfig(Section):
    name: str = "fedavg"
    params: dict[str, Any] = Field(default_factory=dict)
    # (the Params class, name, settings) -> the typed params validated from them: validated
    # once, read by every check, the plan and the toolbox (a copy with other params, or a
    # plugin run again with a new Params class, validates anew).
    _typed: tuple[object, Params] | None = PrivateAttr(default=None)

    def typed_params(self) -> Params:
        """The params validated by the algorithm's own typed model (what else a plugin's
        validators raise: one line naming its class, registry.algorithm_params); validated
        once per algorithm class and settings, then carried."""
        key = (get_algorithm(self.name).Params, self.name, repr(self.params))
        if self.__pydantic_private__ is None:  # built without its private part (a bare copy)
            object.__setattr__(self, "__pydantic_private__", {"_typed": None})
        typed = self.__pydantic_private__.get("_typed")
        if typed is None or typed[0] != key:
            typed = (key, algorithm_params(self.name, self.params))
            self.__pydantic_private__["_typed"] = typed
        return typed[1]

    def __getstate__(self) -> dict[Any, Any]:
        """Pickled without the typed params: an actor unpickles its config before it imports
        the plugins whose Params class they may be."""
        state = super().__getstate__()
        state["__pydantic_private__"] = {
            **(state.get("__pydantic_private__") or {}),
            "_typed": None,
        }
        return state


class TopologyConfig(Section):
    kind: str | None = Field(None, description="star | hierarchical | none | a peer graph kind")
    params: dict[str, Any] = Field(default_factory=dict, description="peer graph parameters")
    num_lps: int = Field(2, ge=1, description="hierarchical: local parameter servers")


class KillClients(Section):
    """`{kill: clients, share: 0.2, seed: 7}`: kill round(share x client actors) of the client
    actors (at least one), each at the start of a round; actors and rounds drawn from `seed`."""

    kill: Literal["clients"]
    share: float = Field(gt=0, le=1, description="the share of the client actors to kill")
    seed: int = Field(0, description="draws which actors, and at which rounds")


class KillHost(Section):
    """`{kill: host, host: clients-1, round: 3}`: kill the named host's actor at the start of
    the round (hosts: clients-<k>, server, lps-<k>, graph, leader-<group>)."""

    kill: Literal["host"]
    host: str = Field(min_length=1, description="a host's name, as in hosts.parquet")
    round: int = Field(ge=1, description="killed at the start of this round")


# runtime.inject_faults entries: which one by `kill`.
FaultSpec = Annotated[KillClients | KillHost, Field(discriminator="kill")]


class RuntimeConfig(Section):
    executor: Literal["ray", "inline"] = "ray"
    address: str | None = Field(None, description="null = start a local Ray; 'auto' = join")
    num_cpus: int | None = Field(None, ge=1, description="CPUs of the local Ray started for you")
    clients_per_actor: int | Literal["auto"] = "auto"
    num_cpus_per_actor: float = Field(1.0, gt=0)
    num_gpus_per_actor: float = Field(0.0, ge=0, description="e.g. 0.25: four actors a GPU")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto = cuda when num_gpus_per_actor > 0, else cpu"
    )
    memory_budget: int | str | None = Field(
        None,
        description="bytes (or '16GB', '512MiB') clients' state may take; null = what "
        "the cluster reports",
    )
    batch_clients: int = Field(
        1,
        ge=1,
        description="train up to this many sampled clients of one architecture together "
        "(torch.func vmap; aimed at GPUs); 1 = one after the other",
    )
    spill_dir: str | None = Field(
        None,
        description="local disk for clients' kept state beyond memory_budget; null = the "
        "system's temporary folder",
    )
    precision: Literal["fp32", "bf16-mixed"] = Field(
        "fp32", description="bf16-mixed: clients train and evaluate under bfloat16 autocast"
    )
    deterministic: bool = Field(
        True,
        description="on a GPU: CUDA's deterministic algorithms (cuDNN, cuBLAS workspace), so "
        "the same seed gives the same numbers run after run; false: the fastest kernels",
    )
    max_restarts: int = Field(0, ge=0)
    min_clients_fraction: float = Field(1.0, gt=0, le=1)
    placement_timeout_s: float = Field(
        60.0,
        gt=0,
        description="seconds to wait for Ray to place the actors (or to declare a lost node "
        "dead) before the run stops with one line",
    )
    autoscale: bool = Field(
        False,
        description="an autoscaling cluster: ask the autoscaler for the client actors' "
        "resources (ray.autoscaler.sdk.request_resources) and wait for them up to "
        "placement_timeout_s; needs a whole-number clients_per_actor",
    )
    inject_faults: list[FaultSpec] = Field(
        default_factory=list,
        description="faults on purpose (Ray executor): {kill: clients, share: 0.2, seed: 7} "
        "or {kill: host, host: clients-1, round: 3}; each kills a Ray actor once",
    )
    dashboard: bool = Field(
        False,
        description="a local Ray (address: null) starts Ray's dashboard on 127.0.0.1:8265, to "
        "watch the actors; about 1.5 s more at start-up on 2 cores",
    )
    join_up: bool = Field(
        True,
        description="with address: null, join the Ray and warm actors of `raymtl up` on this "
        "machine when it serves this raymtl's code (no Ray or actor start-up)",
    )
    reuse_actors: bool = Field(
        True,
        description="seeds of a run and experiments of a sequential compare hand their actors "
        "on to the next federation of the same layout (fresh state each time; results equal "
        "separate runs'): no actor start-up after the first",
    )

    @field_validator("inject_faults", mode="before")
    @classmethod
    def _each_fault_says_what_it_kills(cls, value: Any) -> Any:
        for index, fault in enumerate(value if isinstance(value, list) else []):
            kill = fault.get("kill") if isinstance(fault, dict) else None
            if kill not in ("clients", "host"):
                raise ValueError(
                    f"kill: {kill!r} (fault {index}) is not a fault; give {{kill: clients, "
                    "share: 0.2, seed: 7} or {kill: host, host: clients-1, round: 3}"
                )
        return value

    @model_validator(mode="after")
    def _faults_and_autoscaling_need_ray(self) -> RuntimeConfig:
        if self.inject_faults and self.executor != "ray":
            raise ValueError(
                "inject_faults: needs executor: ray (a fault kills a host's Ray actor; the "
                "inline executor's hosts share this process)"
            )
        if self.autoscale and self.executor != "ray":
            raise ValueError("autoscale: needs executor: ray")
        if self.autoscale and self.clients_per_actor == "auto":
            raise ValueError(
                "autoscale: needs a whole-number clients_per_actor (auto sizes the federation "
                "by the CPUs up now, so the autoscaler is never asked to grow)"
            )
        return self

    @field_validator("clients_per_actor")
    @classmethod
    def _at_least_one_client(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 1:
            raise ValueError(f"{value} clients an actor; give 'auto' or a whole number, at least 1")
        return value

    @field_validator("memory_budget")
    @classmethod
    def _a_positive_size(cls, value: int | str | None) -> int | str | None:
        size = None if value is None else size_in_bytes(value)
        if value is not None and size is None:
            raise ValueError(f"{value!r} is not a size like 16GB or 512MiB")
        if size is not None and size <= 0:
            raise ValueError(f"{value!r} is not a positive size; give one like 16GB or 512MiB")
        return value

    @property
    def memory_budget_bytes(self) -> int | None:
        """`memory_budget` in bytes (None: no budget); the validator has read it already."""
        return None if self.memory_budget is None else size_in_bytes(self.memory_budget)


class OutputConfig(Section):
    dir: str = "runs"
    plots: bool = True


class MetricsConfig(Section):
    """What the summaries measure beyond the final round: the cost of reaching a target."""

    target: float | None = Field(
        None,
        description="the value of `metric` to reach (e.g. 0.8); the summary gives the rounds, "
        "bits and wall time each seed needed, or 'not reached'; null = no target",
    )
    metric: Literal["mean_accuracy", "worst10_accuracy", "worst20_accuracy", "mean_loss"] = Field(
        "mean_accuracy",
        description="the rounds.parquet column the target is on: reached when it is >= target "
        "(<= target for mean_loss)",
    )

    @model_validator(mode="after")
    def _accuracy_target_is_a_fraction(self) -> MetricsConfig:
        accuracy = self.metric != "mean_loss"
        if accuracy and self.target is not None and not 0 < self.target <= 1:
            raise ValueError(
                f"target: {self.target} is not an accuracy in (0, 1]; give a fraction, e.g. 0.8"
            )
        return self


class ExperimentConfig(Section):
    plugins: list[str] = Field(
        default_factory=list,
        description="modules (names on sys.path, or .py paths) imported before the rest is "
        "validated: they register algorithms, models, datasets, partitions, topologies, targets",
    )
    name: str = Field(
        "experiment",
        min_length=1,
        description="the run's folder name inside output.dir: no path separators",
    )
    data: DataConfig = DataConfig()
    model: ModelConfig = ModelConfig()
    algorithm: AlgorithmConfig = AlgorithmConfig()
    topology: TopologyConfig = TopologyConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    rounds: int = Field(10, ge=1)
    eval_every: int = Field(1, ge=1)
    eval_fraction: float = Field(
        1.0,
        gt=0,
        le=1,
        description="the share of clients evaluated when evaluation is due (a seeded sample "
        "per round); 1 = every client",
    )
    eval_all_at_end: bool = Field(
        True, description="eval_fraction < 1: the last round still evaluates every client"
    )
    checkpoint_every: int = Field(5, ge=1)
    seeds: list[int] = Field(default_factory=lambda: [0], min_length=1)
    output: OutputConfig = OutputConfig()
    metrics: MetricsConfig = MetricsConfig()
    # The toolbox (docs/ALGORITHMS.md §9): how models are combined, the server's optimiser,
    # client-level DP, uplink compression, malicious clients.
    aggregation: AggregationSettings = AggregationSettings()
    server_optimizer: ServerOptimizerSettings = ServerOptimizerSettings()
    privacy: PrivacySettings = PrivacySettings()
    compression: CompressionSettings = CompressionSettings()
    attack: AttackSettings = AttackSettings()
    sampling: Literal["uniform", "poisson"] = Field(
        "uniform",
        description="uniform: ⌈m·N⌉ clients a round without replacement; poisson: each client "
        "with probability m, a cohort of varying size (DP's poisson accounting is then exact)",
    )

    @field_validator("name")
    @classmethod
    def _name_stays_in_output_dir(cls, name: str) -> str:
        if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.=,+-]*", name):
            raise ValueError(
                f"'{name}' may hold only letters, digits and _ . = , + - (it names the run's "
                "folder inside output.dir)"
            )
        return name

    @model_validator(mode="before")
    @classmethod
    def _load_plugins_first(cls, raw: Any) -> Any:
        # Before any field: the names the rest of the file uses may be the plugins'.
        entries = raw.get("plugins") if isinstance(raw, dict) else None
        if isinstance(entries, str):  # `plugins: my_module`, one entry
            entries = [entries]
        if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries):
            return raw  # not a list of strings: the field's own validation says so
        resolved = [resolve_entry(entry) for entry in entries]
        load_plugins(resolved)
        return {**raw, "plugins": resolved}

    @model_validator(mode="after")
    def _check_combinations(self) -> ExperimentConfig:
        check_names(self)
        check_algorithm(self)
        check_topology(self)
        check_tasks(self)
        check_models(self)
        check_toolbox(self)
        return self

    def toolbox(self) -> Toolbox:
        """The five toolbox sections together (what every step's context carries)."""
        return Toolbox(
            aggregation=self.aggregation,
            server_optimizer=self.server_optimizer,
            privacy=self.privacy,
            compression=self.compression,
            attack=self.attack,
            cohort=self.cohort(),
        )

    def cohort(self) -> float:
        """m_t: ⌈m·N⌉ clients a round, or q·N expected under Poisson sampling."""
        from raymtl.algorithms.training import sample_size

        fraction = self.algorithm.typed_params().sample_fraction
        if self.sampling == "poisson":
            return fraction * self.data.num_clients
        return float(sample_size(fraction, self.data.num_clients))

    def shape(self) -> str:
        """star | peer | hierarchical | none | groups: the shape the topology gives."""
        kind = self.topology.kind
        return kind if kind in STRUCTURED_KINDS else "peer"


def parse_config(raw: dict) -> ExperimentConfig:
    """Validate a raw mapping (its plugins imported first); every failure is one ConfigError
    line. Relative plugin paths are looked up in the current folder (`load_raw` has made
    those of an experiment file absolute)."""
    if isinstance(raw, dict) and "arms" in raw:
        raise ConfigError(
            "arms: this file is a comparison (one experiment per arm): run it with raymtl compare"
        )
    try:
        return ExperimentConfig.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(first_error(error, model=ExperimentConfig)) from None
    except ValueError as error:  # raised by builders called from validators
        raise ConfigError(one_line(error)) from None


def load_raw(path: str | Path, overrides: list[str] = ()) -> dict:
    """The YAML mapping of `path` with overrides applied (not yet validated); the relative
    paths of its plugins resolved next to the file, then in the current folder."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"experiment file: '{path}' does not exist")
    try:
        raw = yaml.safe_load(path.read_bytes().decode())
    except UnicodeDecodeError:
        raise ConfigError(f"experiment file: '{path}' is not a text file (UTF-8 YAML)") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"experiment file: '{path}' is not valid YAML ({error})") from None
    if raw is None or raw == {}:  # every setting a default is never what was meant
        raise ConfigError(f"experiment file: '{path}' is empty (it holds no settings)")
    if not isinstance(raw, dict):
        raise ConfigError(f"experiment file: '{path}' must hold a mapping")
    resolve_data_path(raw, path.resolve().parent)
    for assignment in overrides:  # a path given on the command line stays the shell's
        apply_override(raw, assignment)
    entries = raw.get("plugins")
    entries = [entries] if isinstance(entries, str) else entries
    if isinstance(entries, list):
        folder = path.resolve().parent
        raw["plugins"] = [resolve_entry(entry, [folder]) for entry in entries]
        # A module name may sit next to the file (a user project run from elsewhere): load it
        # from there now, so validation finds it and hosts are told the folder.
        load_plugins([e for e in raw["plugins"] if isinstance(e, str)], [str(folder)])
    return raw


def resolve_data_path(raw: dict, folder: Path) -> None:
    """A relative `data.params.path` of an experiment file is the file's neighbour, as its
    plugins are (under `data.root` instead when the file sets one): the experiment runs the
    same from any folder, and a missing file is named by the path raymtl tried."""
    arms = raw.get("arms")
    for section in [raw, *(arms.values() if isinstance(arms, dict) else ())]:
        data = section.get("data") if isinstance(section, dict) else None
        params = data.get("params") if isinstance(data, dict) else None
        if not isinstance(params, dict) or data.get("root"):
            continue
        given = params.get("path")
        if isinstance(given, str) and given and not Path(given).expanduser().is_absolute():
            params["path"] = str(folder / given)


def load_config(path: str | Path, overrides: list[str] = ()) -> ExperimentConfig:
    """Load, override and validate an experiment file."""
    return parse_config(load_raw(path, overrides))


def dump_config(cfg: ExperimentConfig) -> str:
    """The resolved experiment as YAML (saved with every run)."""
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)
