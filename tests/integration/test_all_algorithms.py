"""Every registered algorithm, built-in or plugin, runs 2 rounds on digits in one process.

One parametrised test over `all_algorithms()`, after the example plugins in examples/ are
loaded (the algorithms their experiment files name join the list). Each algorithm gets the
topology, tasks and public data it needs from SETTINGS (keyed by name; the default suits a
star algorithm) and must give finite metrics, a messages.parquet whose bits add up to
rounds.parquet's, and, where BITS knows the algorithm, exactly the bits its maths sends
(docs/ALGORITHMS.md states them).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from raymtl.algorithms import all_algorithms
from raymtl.config import parse_config
from raymtl.models import build_model
from raymtl.plugins import load_plugins, resolve_entry
from raymtl.runtime import run_experiment
from raymtl.runtime.loop.accounting import link_direction
from tests.conftest import digits_experiment

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
N, ROUNDS, MODEL, SHAPE, CLASSES = 6, 2, "mlp", (1, 8, 8), 10
B, D, M, T = 8, 16, 2, 2  # FedMuscle: public batch, dims, partners, contrastive steps


def load_example_plugins() -> None:
    """Import the plugins every example experiment names (their algorithms register)."""
    for path in sorted(EXAMPLES.rglob("*.yaml")) if EXAMPLES.is_dir() else []:
        entries = (yaml.safe_load(path.read_text()) or {}).get("plugins") or []
        load_plugins([resolve_entry(entry, [path.parent]) for entry in entries])


load_example_plugins()

TWO_TASKS = {
    "data.partition": {"kind": "iid", "max_samples_per_client": 60},
    "data.tasks": [
        {"name": "low", "targets": "label", "clients": N // 2},
        {"name": "high", "targets": "label", "clients": N // 2},
    ],
}
HIERARCHICAL = {"topology.kind": "hierarchical", "topology.num_lps": 2}
RING = {"topology.kind": "ring"}
PUBLIC = {
    "data.public": {"size": 60},
    "algorithm.params": {"epochs": 1, "contrastive_steps": T, "public_batch": B, "dim": D},
}
SETTINGS = {
    "fedbn": {"model.name": "cnn_bn"},  # FedBN refuses a model without batch norm
    "dpsgd": RING,
    "dfedu": RING,
    "sheaf_fmtl": RING,
    "hfedavg": HIERARCHICAL,
    "oneshot_hfl": HIERARCHICAL,
    "colnet": TWO_TASKS,
    "intra_group": TWO_TASKS,
    "fedper_ic": TWO_TASKS,
    "fedmuscle": {**PUBLIC, "algorithm.params": {**PUBLIC["algorithm.params"], "partners": M}},
    "pairwise_infonce": PUBLIC,
}


def floats(prefixes: tuple[str, ...] = ("",), model: str = MODEL) -> int:
    """Floating-point entries of the model's state whose names start with `prefixes`."""
    state = build_model(model, SHAPE, CLASSES).state_dict()
    return sum(
        t.numel() for n, t in state.items() if t.is_floating_point() and n.startswith(prefixes)
    )


def without_batch_norm(model: str) -> int:
    """Floating-point entries of the model's state outside its batch-norm layers (FedBN's)."""
    from torch.nn.modules.batchnorm import _BatchNorm

    built = build_model(model, SHAPE, CLASSES)
    kept = {
        f"{prefix}.{name}"
        for prefix, module in built.named_modules()
        if isinstance(module, _BatchNorm)
        for name, _ in [
            *module.named_parameters(recurse=False),
            *module.named_buffers(recurse=False),
        ]
    }
    return floats(model=model) - sum(
        t.numel() for n, t in built.state_dict().items() if n in kept and t.is_floating_point()
    )


def sampled(fraction: float) -> int:
    """⌈m·N⌉ clients a round (exact here: m·N is a whole number)."""
    return math.ceil(fraction * N)


# Per round (up, down) bits, from docs/ALGORITHMS.md; P = |w|, 32 bits a float.
P = floats()
BACKBONE = floats(("backbone.",))  # the MLP's backbone is its first layer,
COMMON = floats(build_model(MODEL, SHAPE, CLASSES).common_prefixes())  # also its common layers
HEAD = floats(("head.",))
FEATURES = build_model(MODEL, SHAPE, CLASSES).feature_dim


def star(fraction: float = 1.0) -> list[tuple[int, int]]:
    """The model to each sampled client and back (FedAvg, FedU, pFedMe, FedAvgM)."""
    bits = sampled(fraction) * P * 32
    return [(bits, bits)] * ROUNDS


def ifca(clusters: int = 4, fraction: float = 1.0) -> list[tuple[int, int]]:
    """K cluster models to each sampled client, its model and its pick ĵ (one int64) back;
    after the cluster-wise average, K models to every client for its evaluation (counted)."""
    s = sampled(fraction)
    return [(s * (P * 32 + 64), (s + N) * clusters * P * 32)] * ROUNDS


def hierarchy() -> tuple[int, int]:
    """Every user's model to its LPS and back; each LPS's common layers to the GPS and back."""
    bits = (N * P + 2 * COMMON) * 32
    return bits, bits


def oneshot() -> list[tuple[int, int]]:
    """Round 1 adds the clustering: k·d eigenvector floats to every other user, a relevance
    row (N floats) to the GPS; back, one int32 per user to the LPSs and one to each user."""
    k, d = 5, SHAPE[1] * SHAPE[2]  # num_eigen; Φ = identity on grey 8×8 digits
    up, down = hierarchy()
    clustering_up = (N * (N - 1) * k * d + N * N) * 32
    return [(up + clustering_up, down + 2 * N * 32), (up, down)]


def task_groups(leaders: bool) -> list[tuple[int, int]]:
    """Round 1 of 2: backbones within each group of 3 (3·2 each), then with leaders: Δ_g to
    the other leader, the next holder (one int64) to it, and b + U with the next holder to
    the 2 members that do not hold the role. The last round trains only."""
    up = 2 * 3 * 2 * BACKBONE * 32
    down = 0
    if leaders:
        up += 2 * (BACKBONE * 32 + 64)
        down = 2 * 2 * (BACKBONE * 32 + 64)
    return [(up, down), (0, 0)]


def sheaf() -> list[tuple[int, int]]:
    """Per directed edge of the ring (2N): P_ij θ_i twice a round (d_ij = ⌊γ·d⌋), and in round
    1 the client's d_i (one int64)."""
    d_ij = math.floor(0.01 * P)
    per_round = 2 * N * 2 * d_ij * 32
    return [(per_round + 2 * N * 64, 0), (per_round, 0)]


def sfmtl() -> list[tuple[int, int]]:
    """Each of ⌈0.5·N⌉ sampled clients: its head and 2 anchor rows (+ 2 int32 class ids) up,
    its new head and its community's anchor rows down."""
    payload = (HEAD + 2 * FEATURES) * 32
    clients = sampled(0.5)
    return [(clients * (payload + 2 * 32), clients * payload)] * ROUNDS


def alignment(down_floats: int) -> list[tuple[int, int]]:
    """T contrastive steps, each: B int64 indices down, Z (B·d floats) up, the targets down."""
    up = T * N * B * D * 32
    down = T * N * (B * 64 + down_floats * 32)
    return [(up, down)] * ROUNDS


BITS = {
    "fedavg": star(),
    "fedavgm": star(),
    "scaffold": [(2 * up, 2 * down) for up, down in star()],  # the model and c, each way
    "scaffold_samples": [(2 * up, 2 * down) for up, down in star()],  # the example's
    "fednova": [(up + sampled(1.0) * 64, down) for up, down in star()],  # + ‖a_k‖₁, float64
    "fedbn": [(sampled(1.0) * without_batch_norm("cnn_bn") * 32,) * 2] * ROUNDS,
    "pfedme": star(),
    "ditto": star(),  # only the global w travels; personal models stay
    "per_fedavg": star(),
    "fedprox": star(),
    "fedrep": [(sampled(0.1) * BACKBONE * 32,) * 2] * ROUNDS,  # the body, down and up
    "ifca": ifca(),
    "fedu": star(),
    "local": [(0, 0)] * ROUNDS,
    "dpsgd": [(2 * N * P * 32, 0)] * ROUNDS,
    "dfedu": [(2 * N * P * 32, 0)] * ROUNDS,
    "hfedavg": [hierarchy()] * ROUNDS,
    "oneshot_hfl": oneshot(),
    "colnet": task_groups(leaders=True),
    "fedper_ic": task_groups(leaders=True),
    "intra_group": task_groups(leaders=False),
    "sheaf_fmtl": sheaf(),
    "sfmtl_graph": sfmtl(),
    "fedmuscle": alignment(B**M * (D + 1)),  # S and α of B^M tuples
    "pairwise_infonce": alignment((N - 1) * B * D),  # every other client's Z
}


def experiment(name: str, tmp_path) -> dict:
    cls = all_algorithms()[name]
    settings = {
        "model.name": MODEL,
        "algorithm.name": name,
        "algorithm.params": {"epochs": 1},
        **SETTINGS.get(name, {}),
    }
    if not cls.__module__.startswith("raymtl."):  # a plugin: the run imports its module
        settings["plugins"] = [sys.modules[cls.__module__].__file__]
    return digits_experiment(tmp_path, **settings)


@pytest.mark.parametrize("name", sorted(all_algorithms()))
def test_two_rounds_on_digits_give_finite_metrics_and_the_declared_bits(name, tmp_path):
    run_dir = Path(run_experiment(parse_config(experiment(name, tmp_path))))
    rounds = pd.read_parquet(run_dir / "rounds.parquet").sort_values("round")
    clients = pd.read_parquet(run_dir / "clients.parquet")
    messages = pd.read_parquet(run_dir / "messages.parquet")

    assert list(rounds["round"]) == [1, 2]
    assert sorted(clients.loc[clients["round"] == ROUNDS, "client"]) == list(range(N))
    for column in ("mean_loss", "mean_accuracy"):
        assert rounds[column].map(math.isfinite).all(), column
    assert clients["loss"].map(math.isfinite).all()

    # messages.parquet itemises rounds.parquet: per round and direction, the same sums
    # (traffic with the graph service and a client's hand-offs to its own role count as neither).
    rows = messages.to_dict("records")
    for direction in ("up", "down"):
        chosen = [row for row in rows if link_direction(row) == direction]
        itemised = [sum(r["bits"] for r in chosen if r["round"] == t) for t in (1, 2)]
        assert itemised == list(rounds[f"bits_{direction}"]), direction
    assert list(rounds["cum_bits"]) == list((rounds["bits_up"] + rounds["bits_down"]).cumsum())

    declared = list(zip(rounds["bits_up"], rounds["bits_down"], strict=True))
    if name in BITS:
        assert declared == BITS[name]
    else:  # a plugin this table does not know: it communicates
        assert rounds["cum_bits"].iloc[-1] > 0

    # FLOPs (raymtl/flops.py): every algorithm trains and evaluates a model, so its clients'
    # steps and the evaluation count work; the round's total is its kinds' sum, cumulated.
    assert (rounds["flops_train"] + rounds["flops_receive"] > 0).all()
    assert (rounds["flops_evaluate"] > 0).all()
    kinds = rounds[["flops_train", "flops_aggregate", "flops_receive", "flops_evaluate"]]
    assert rounds["flops"].tolist() == pytest.approx(kinds.sum(axis=1).tolist())
    assert rounds["cum_flops"].tolist() == pytest.approx(rounds["flops"].cumsum().tolist())
