"""One-shot clustering HFL end to end: `raymtl run` on Ray, what travels, the baselines."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from raymtl.cli import app
from raymtl.config import parse_config
from raymtl.data.sources import DEBIAN_FASHION_MNIST_DIR
from raymtl.models import build_model
from raymtl.runtime import run_experiment
from tests.conftest import digits_experiment

K, N = 5, 6
CLUSTERING_KINDS = {"eigenvectors", "relevance", "similarity", "clusters", "membership"}
TRAINING_KINDS = {"model", "common", "lps_model"}
fashion_mnist = pytest.mark.skipif(
    not Path(DEBIAN_FASHION_MNIST_DIR).is_dir(), reason="Fashion-MNIST is not installed"
)


def two_task_experiment(tmp_path, **overrides) -> dict:
    """6 users: 3 mostly clothes, 3 mostly shoes and bags; 2 LPSs; MLP 784→32→10."""
    settings = {
        "data.name": "fashion_mnist",
        "data.num_clients": N,
        "data.partition": {
            "kind": "fmnist_tasks",
            "task_classes": [[0, 1, 2, 3, 4, 6], [5, 7, 8, 9]],
            "task_users": [3, 3],
            "max_samples_per_client": 150,
        },
        "model.name": "mlp",
        "model.params": {"hidden": 32},
        "algorithm.name": "oneshot_hfl",
        "algorithm.params": {"epochs": 1, "lr": 0.1, "num_eigen": K},
        "topology.kind": "hierarchical",
        "topology.num_lps": 2,
        "rounds": 2,
    }
    return digits_experiment(tmp_path, **{**settings, **overrides})


@pytest.fixture(scope="module")
def ray_run(ray_session, tmp_path_factory):
    """The whole algorithm through `raymtl run` on Ray: 2 global rounds, 2 LPSs."""
    tmp_path = tmp_path_factory.mktemp("oneshot")
    path = tmp_path / "experiment.yaml"
    path.write_text(yaml.safe_dump(two_task_experiment(tmp_path)))
    result = CliRunner().invoke(app, ["run", str(path), "runtime.executor=ray"])
    assert result.exit_code == 0, result.output
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir() and p.name.startswith("test-")]
    return run_dir


@pytest.mark.ray
@fashion_mnist
def test_raymtl_run_recovers_the_two_tasks(ray_run):
    summary = json.loads((ray_run / "summary.json").read_text())
    clustering = summary["clustering"]
    assert clustering["ari"]["mean"] == 1.0 and clustering["feature_map"] == ["identity"]
    assert clustering["assignment"]["0"] == [0, 0, 0, 1, 1, 1]
    assert set(clustering["task_accuracy"]) == {"0", "1"}
    assert list(pd.read_parquet(ray_run / "rounds.parquet")["round"]) == [1, 2]
    for table in ("oneshot_relevance", "oneshot_linkage", "oneshot_features"):
        assert (ray_run / f"{table}.parquet").is_file(), table


@pytest.mark.ray
@fashion_mnist
def test_only_eigenvectors_relevances_and_layers_travel(ray_run):
    messages = pd.read_parquet(ray_run / "messages.parquet")
    assert set(messages["kind"]) == CLUSTERING_KINDS | TRAINING_KINDS
    d, samples = 784, 150
    eigen = messages.query("kind == 'eigenvectors'")
    assert len(eigen) == N * (N - 1) and set(eigen["round"]) == {1}
    assert set(eigen["bits"]) == {K * d * 32}  # k eigenvectors: never Σ (d·d) nor X (n·d)
    assert set(eigen["src_role"]) == set(eigen["dst_role"]) == {"client"}
    relevance = messages.query("kind == 'relevance'")
    assert set(relevance["bits"]) == {N * 32} and set(relevance["dst"]) == {"server"}
    assert set(messages.query("kind == 'similarity'")["bits"]) == {N * N * 32}
    clustering = messages[messages["kind"].isin(CLUSTERING_KINDS)]
    assert clustering["bits"].max() < min(d * d, samples * d) * 32
    model = build_model("mlp", (1, 28, 28), 10, hidden=32)
    whole = sum(v.numel() for v in model.state_dict().values()) * 32
    first_layer = sum(v.numel() for k, v in model.state_dict().items() if "fc1" in k) * 32
    assert set(messages.query("kind in ['model', 'lps_model']")["bits"]) == {whole}
    assert set(messages.query("kind == 'common'")["bits"]) == {first_layer}


@pytest.mark.ray
@fashion_mnist
def test_users_train_with_the_lps_the_clustering_chose(ray_run):
    messages = pd.read_parquet(ray_run / "messages.parquet")
    models = messages.query("kind == 'model'")
    lps = {src: dst for src, dst in zip(models["src"], models["dst"], strict=True)}
    assert lps == {f"client/{i}": f"lps/{0 if i < 3 else 1}" for i in range(N)}
    rounds = pd.read_parquet(ray_run / "rounds.parquet")
    graph = messages[(messages["src"] == "graph") | (messages["dst"] == "graph")]
    counted = messages[~messages.index.isin(graph.index)].groupby("round")["bits"].sum()
    assert list(rounds["bits_up"] + rounds["bits_down"]) == list(counted)


@pytest.mark.parametrize("clustering", ["random", "oracle"])
def test_baselines_run_inline_with_heads_of_different_sizes(tmp_path, clustering):
    """Relabelled tasks (3 and 7 classes): LPSs average each head only among equal shapes."""
    raw = digits_experiment(
        tmp_path,
        **{
            "data.partition": {
                "kind": "task_groups",
                "task_classes": [[0, 1, 2], [3, 4, 5, 6, 7, 8, 9]],
                "classes_per_client": 3,
            },
            "algorithm.name": "oneshot_hfl",
            "algorithm.params": {"epochs": 1, "lr": 0.1, "clustering": clustering},
            "topology.kind": "hierarchical",
            "topology.num_lps": 2,
        },
    )
    run_dir = run_experiment(parse_config(raw))
    clustering_summary = json.loads((run_dir / "summary.json").read_text())["clustering"]
    assert len(clustering_summary["assignment"]["0"]) == 6
    if clustering == "oracle":
        assert clustering_summary["assignment"]["0"] == [0, 1, 0, 1, 0, 1]  # task = client % 2
        assert clustering_summary["ari"]["mean"] == 1.0
        kinds = set(pd.read_parquet(run_dir / "messages.parquet")["kind"])
        assert "eigenvectors" not in kinds  # the oracle needs no clustering traffic
    else:  # seed 0 deals users of both head sizes (3 and 7 classes) into one LPS
        assert clustering_summary["ari"]["mean"] < 1.0
    clients = pd.read_parquet(run_dir / "clients.parquet")
    assert clients["accuracy"].notna().all() and len(clients) == 12
