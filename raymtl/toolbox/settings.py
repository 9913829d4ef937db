"""The toolbox's five sections of an experiment file (docs/ALGORITHMS.md §9): how models are
combined (`aggregation`), the server's optimiser (`server_optimizer`), client-level
differential privacy (`privacy`), what compresses the clients' uplink (`compression`) and the
malicious clients of a robustness study (`attack`).

They are plain frozen pydantic models, so every layer that needs them (the config that
validates them, the steps that read them from `StepContext.toolbox`, the runtime's hosts
that apply them) shares one definition. Each holds its own rules; the rules that need the
rest of the experiment (the algorithm, the cohort) are in raymtl/config/checks.py.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class ToolboxSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


RULES = ("mean", "median", "trimmed_mean", "krum", "multi_krum")


class AggregationSettings(ToolboxSection):
    """§9.1: how an averaging step combines the models it receives."""

    rule: Literal["mean", "median", "trimmed_mean", "krum", "multi_krum"] = Field(
        "mean", description="mean | median | trimmed_mean | krum | multi_krum"
    )
    weights: Literal["samples", "uniform"] = Field(
        "samples",
        description="mean (and multi_krum): weight each model by its client's samples, or "
        "take the plain mean (the FedRep, FedProx, IFCA and Per-FedAvg papers' own)",
    )
    beta: float = Field(
        0.1, ge=0, lt=0.5, description="trimmed_mean: drop the ⌊β·m⌋ largest and smallest"
    )
    f: int = Field(0, ge=0, description="krum / multi_krum: Byzantine clients assumed")
    keep: int | None = Field(
        None, ge=1, description="multi_krum: models averaged (M); null = m − f"
    )

    @field_validator("rule", mode="before")
    @classmethod
    def _dashes(cls, value):
        return value.replace("-", "_") if isinstance(value, str) else value

    def is_default(self) -> bool:
        return self.rule == "mean" and self.weights == "samples"

    def robust(self) -> bool:
        """A rule other than the mean: it has no sensitivity bound for DP."""
        return self.rule != "mean"


OPTIMIZERS = ("none", "fedadam", "fedyogi", "fedadagrad", "momentum")


class ServerOptimizerSettings(ToolboxSection):
    """§9.2: an optimiser on the pseudo-gradient Δ_t = aggregate − w_t."""

    name: Literal["none", "fedadam", "fedyogi", "fedadagrad", "momentum"] = Field(
        "none", description="none | fedadam | fedyogi | fedadagrad | momentum (FedAvgM)"
    )
    lr: float | None = Field(
        None, gt=0, description="server learning rate η; null = 0.01 (adaptive), 1 (momentum)"
    )
    betas: tuple[float, float] = Field((0.9, 0.99), description="β₁, β₂ of the adaptive ones")
    tau: float = Field(1e-3, gt=0, description="adaptivity τ (v starts at τ²)")
    momentum: float = Field(0.9, ge=0, lt=1, description="server momentum β (momentum)")
    v0: float | None = Field(
        None, ge=0, description="the adaptive ones' v before round 1; null = τ² (the paper)"
    )
    bias_correction: bool = Field(
        False, description="Adam's bias correction of the learning rate (Flower's FedAdam)"
    )

    @field_validator("betas")
    @classmethod
    def _betas_in_unit_interval(cls, betas):
        for index, beta in enumerate(betas):
            if not 0 <= beta < 1:
                raise ValueError(f"β{index + 1} = {beta} is not in [0, 1)")
        return betas

    @property
    def step_size(self) -> float:
        if self.lr is not None:
            return self.lr
        return 1.0 if self.name == "momentum" else 0.01

    def is_default(self) -> bool:
        return self.name == "none"


class SampleLevelSettings(ToolboxSection):
    """§9.3 last item: DP-SGD inside local training (Opacus)."""

    clip: float = Field(gt=0, description="per-sample gradient norm bound C_s")
    noise_multiplier: float = Field(ge=0, description="σ_s: noise std per batch is σ_s·C_s")
    delta: float = Field(1e-5, gt=0, lt=1, description="δ of each client's ε")


class PrivacySettings(ToolboxSection):
    """§9.3: client-level DP (DP-FedAvg), and/or sample-level DP-SGD."""

    clip: float | None = Field(
        None,
        gt=0,
        description="the update norm bound C (the initial one when adaptive); "
        "null = no client-level DP",
    )
    noise_multiplier: float = Field(0.0, ge=0, description="σ: the sum's noise std is σ·C")
    delta: float | None = Field(
        None, gt=0, lt=1, description="δ of the reported ε; null = min(1e-5, N^-1.1)"
    )
    clipping: Literal["fixed", "adaptive"] = "fixed"
    noise: Literal["server", "client", "local"] = Field(
        "server",
        description="server: central DP, clipped on the aggregator; client: central DP, "
        "clipped on each client's host too; local: each client adds its own noise",
    )
    accounting: Literal["poisson", "without_replacement"] = Field(
        "poisson",
        description="poisson (q = m/N, add/remove-one; exact under sampling: poisson) or "
        "without_replacement (replace-one, noise multiplier σ/2)",
    )
    target_epsilon: float | None = Field(
        None, gt=0, description="refuse a run whose rounds would spend more than this ε"
    )
    target_quantile: float = Field(
        0.5, gt=0, lt=1, description="adaptive: the quantile γ of the norms C tracks"
    )
    clip_lr: float = Field(0.2, gt=0, description="adaptive: the geometric step η_C")
    count_noise: float | None = Field(
        None, gt=0, description="adaptive: σ_b of the clipped count; null = m/20"
    )
    sample_level: SampleLevelSettings | None = Field(
        None, description="DP-SGD inside local training: {clip, noise_multiplier, delta}"
    )

    @model_validator(mode="after")
    def _what_needs_a_clip(self) -> PrivacySettings:
        if self.clip is None:
            if self.noise_multiplier:
                raise ValueError("noise_multiplier: needs a clip (the noise std is σ·C)")
            if self.target_epsilon is not None:
                raise ValueError("target_epsilon: needs a clip (client-level DP)")
            if self.clipping == "adaptive":
                raise ValueError("clipping: adaptive needs a clip (its starting value)")
        return self

    @property
    def client_level(self) -> bool:
        return self.clip is not None

    def is_default(self) -> bool:
        return self.clip is None and self.sample_level is None


class UplinkCodec(ToolboxSection):
    """§9.4: one compressor of the update Δ_k a client sends."""

    kind: Literal["topk", "qsgd", "sign"] = Field(description="topk | qsgd | sign")
    ratio: float = Field(
        0.01, gt=0, le=1, description="topk: the fraction r of each tensor's entries kept"
    )
    levels: int = Field(
        1, ge=1, description="qsgd: the levels s (1 + ⌈log₂(s+1)⌉ bits an entry: 1 -> 2, 127 -> 8)"
    )
    error_feedback: bool = Field(False, description="keep what was not sent and add it next time")

    @field_validator("kind", mode="before")
    @classmethod
    def _aliases(cls, value):
        aliases = {"top_k": "topk", "top-k": "topk", "scaled_sign": "sign"}
        return aliases.get(value, value) if isinstance(value, str) else value


class CompressionSettings(ToolboxSection):
    uplink: UplinkCodec | None = Field(None, description="{kind, ratio, levels, error_feedback}")

    def is_default(self) -> bool:
        return self.uplink is None


ATTACKS = ("sign_flip", "scale", "gaussian", "label_flip")
DEFAULT_ATTACK_SCALE = {"sign_flip": 1.0, "scale": 10.0, "gaussian": 1.0, "label_flip": 1.0}


class AttackSettings(ToolboxSection):
    """§9.5: a seeded fraction of the clients is malicious for the whole run."""

    fraction: float = Field(0.0, ge=0, lt=1, description="the malicious share a of the N clients")
    kind: Literal["sign_flip", "scale", "gaussian", "label_flip"] = "sign_flip"
    scale: float | None = Field(
        None, gt=0, description="s; null = 1 (sign_flip, gaussian), 10 (scale)"
    )

    @property
    def strength(self) -> float:
        return self.scale if self.scale is not None else DEFAULT_ATTACK_SCALE[self.kind]

    def is_default(self) -> bool:
        return self.fraction == 0


class Toolbox(ToolboxSection):
    """The five sections together: what `StepContext.toolbox` carries to every step."""

    aggregation: AggregationSettings = AggregationSettings()
    server_optimizer: ServerOptimizerSettings = ServerOptimizerSettings()
    privacy: PrivacySettings = PrivacySettings()
    compression: CompressionSettings = CompressionSettings()
    attack: AttackSettings = AttackSettings()
    # m_t as central DP divides by it: the configured cohort ⌈m·N⌉, or under Poisson sampling
    # its expectation q·N (not the drawn cohort's size, which the data would decide);
    # 0: the round's sampled clients (a context built by hand)
    cohort: float = Field(0.0, ge=0)
