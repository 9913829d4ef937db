"""Tasks: losses, metrics, optimisers, the experiment file's task section and its refusals."""

from __future__ import annotations

import pytest
import torch
from sklearn.metrics import precision_recall_fscore_support

from raymtl.config import ConfigError, parse_config
from raymtl.data import load_pool, partition_clients
from raymtl.tasks.assign import assign_tasks
from raymtl.tasks.objectives import MetricAccumulator, build_optimizer, micro_prf
from raymtl.tasks.spec import OptimizerSpec, TaskSpec
from tests.conftest import digits_experiment

ATTRIBUTES = TaskSpec("attributes", "attributes", "bce", 5, metrics=("precision", "recall", "f1"))
LANDMARKS = TaskSpec("landmarks", "landmarks", "mse", 2, metrics=("mse", "mae"))
TWO_TASKS = [
    {"name": "attributes", "targets": "attributes", "clients": 2},
    {
        "name": "landmarks",
        "targets": "landmarks",
        "clients": 4,
        "optimizer": {"name": "adam", "lr": 0.001},
    },
]


def test_micro_precision_recall_f1_match_scikit_learn_over_batches():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(37, 5, generator=generator)
    targets = (torch.rand(37, 5, generator=generator) > 0.6).float()
    metrics = MetricAccumulator(ATTRIBUTES)
    metrics.add(logits[:20], targets[:20])  # two evaluation batches
    metrics.add(logits[20:], targets[20:])
    got = metrics.result()
    predicted = (torch.sigmoid(logits) > 0.5).int().numpy()
    expected = precision_recall_fscore_support(
        targets.int().numpy(), predicted, average="micro", zero_division=0
    )
    assert got["precision"] == pytest.approx(expected[0])
    assert got["recall"] == pytest.approx(expected[1])
    assert got["f1"] == pytest.approx(expected[2])
    bce = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets)
    assert got["loss"] == pytest.approx(float(bce), rel=1e-6)


def test_micro_scores_without_positives_are_zero_not_nan():
    assert micro_prf(0, 0, 0) == {"precision": 0.0, "recall": 0.0, "f1": 0.0}
    assert micro_prf(2, 2, 0) == pytest.approx({"precision": 0.5, "recall": 1.0, "f1": 2 / 3})


def test_regression_metrics_by_hand():
    metrics = MetricAccumulator(LANDMARKS)
    metrics.add(torch.tensor([[0.0, 1.0], [2.0, 2.0]]), torch.tensor([[1.0, 1.0], [0.0, 2.0]]))
    # errors -1, 0, 2, 0: mse = (1 + 4) / 4, mae = 3 / 4
    assert metrics.result() == pytest.approx({"loss": 1.25, "mse": 1.25, "mae": 0.75})


def test_classification_keeps_loss_and_accuracy():
    metrics = MetricAccumulator(None)
    metrics.add(torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 0.0]]), torch.tensor([0, 0, 0]))
    assert metrics.result()["accuracy"] == pytest.approx(2 / 3)


@pytest.mark.parametrize(
    ("spec", "kind", "settings"),
    [
        (OptimizerSpec("sgd", 0.1, 0.9, 1e-3), torch.optim.SGD, {"momentum": 0.9}),
        (OptimizerSpec("adam", 5e-4), torch.optim.Adam, {"lr": 5e-4}),
        (
            OptimizerSpec("adamw", 5e-5, weight_decay=5e-3),
            torch.optim.AdamW,
            {"weight_decay": 5e-3},
        ),
    ],
)
def test_a_task_brings_its_own_optimiser(spec, kind, settings):
    task = TaskSpec("t", optimizer=spec)
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(2))], task, OptimizerSpec())
    assert type(optimizer) is kind
    for key, value in settings.items():
        assert optimizer.param_groups[0][key] == value


def test_without_an_optimiser_the_algorithms_sgd_is_used():
    fallback = OptimizerSpec("sgd", 0.3, 0.5, 0.0)
    optimizer = build_optimizer([torch.nn.Parameter(torch.zeros(2))], TaskSpec("t"), fallback)
    assert type(optimizer) is torch.optim.SGD and optimizer.param_groups[0]["lr"] == 0.3


def config(tmp_path, **overrides):
    settings = {
        "data.partition": {"kind": "iid"},
        "data.tasks": TWO_TASKS,
        "algorithm.name": "colnet",
        **overrides,
    }
    return parse_config(digits_experiment(tmp_path, **settings))


def test_tasks_are_dealt_in_file_order_with_their_heads(tmp_path):
    cfg = config(tmp_path)
    pool = load_pool("digits")
    shards = partition_clients(pool.y.numpy(), 10, num_clients=6, kind="iid", seed=0)
    shards, specs = assign_tasks(cfg, {"digits": pool}, shards)
    assert [s.task for s in shards] == [0, 0, 1, 1, 1, 1]
    assert [s.loss for s in specs] == ["bce", "mse"]
    assert specs[0].metrics == ("precision", "recall", "f1") and specs[1].metrics == ("mse", "mae")
    assert specs[0].outputs >= 6 and specs[1].outputs == 6
    assert specs[1].optimizer == OptimizerSpec("adam", 0.001) and specs[0].optimizer is None


@pytest.mark.parametrize("algorithm", ["fedavg", "dpsgd", "fedu", "pfedme", "sfmtl_graph"])
def test_algorithms_that_average_whole_models_refuse_different_tasks(tmp_path, algorithm):
    with pytest.raises(ConfigError) as error:
        config(tmp_path, **{"algorithm.name": algorithm, "topology.kind": None})
    message = str(error.value)
    assert message.startswith("algorithm.name: ") and "\n" not in message
    assert "colnet" in message and "hfedavg" in message


@pytest.mark.parametrize("algorithm", ["colnet", "fedper_ic", "intra_group", "local", "hfedavg"])
def test_backbone_sharing_algorithms_accept_different_tasks(tmp_path, algorithm):
    assert config(tmp_path, **{"algorithm.name": algorithm}).data.tasks[1].name == "landmarks"


@pytest.mark.parametrize(
    ("tasks", "field"),
    [
        ([{"name": "a", "targets": "landmarks", "loss": "bce", "clients": 6}], "loss"),
        ([{"name": "a", "targets": "attributes", "metrics": ["mae"], "clients": 6}], "metrics"),
        ([{"name": "a", "clients": 2}, {"name": "b", "clients": 2}], "clients"),
        ([{"name": "a", "clients": 3}, {"name": "a", "clients": 3}], "names"),
        ([{"name": "a", "optimizer": {"name": "adam", "lr": 0.1, "momentum": 0.9}}], "momentum"),
    ],
)
def test_bad_tasks_are_one_line_naming_the_field(tmp_path, tasks, field):
    with pytest.raises(ConfigError) as error:
        config(tmp_path, **{"data.tasks": tasks})
    assert field in str(error.value) and "\n" not in str(error.value)


def test_labels_only_algorithms_refuse_attribute_targets(tmp_path):
    tasks = [{"name": "attributes", "targets": "attributes"}]
    with pytest.raises(ConfigError, match="data.tasks: sfmtl_graph trains on class labels"):
        config(tmp_path, **{"data.tasks": tasks, "algorithm.name": "sfmtl_graph"})


def test_declared_outputs_must_fit_the_targets(tmp_path):
    from raymtl.runtime.executors.planning import partition

    tasks = [{"name": "landmarks", "targets": "landmarks", "outputs": 5}]
    cfg = config(tmp_path, **{"data.tasks": tasks, "algorithm.name": "fedavg"})
    with pytest.raises(ConfigError, match=r"data.tasks.0.outputs: 5, but targets 'landmarks'"):
        partition(cfg, 0)


def test_lps_averages_task_layers_only_within_a_kind_of_task():
    from raymtl.algorithms.hierarchy import COMMON, pick, shape_average, signature

    common = ("backbone.",)
    a = {"backbone.w": torch.tensor([1.0]), "head.w": torch.tensor([10.0, 10.0])}
    b = {"backbone.w": torch.tensor([3.0]), "head.w": torch.tensor([30.0, 30.0])}
    c = {"backbone.w": torch.tensor([5.0]), "head.w": torch.tensor([50.0, 50.0])}
    keys = [signature(a, 0, common), signature(b, 1, common), signature(c, 0, common)]
    store = shape_average([(t, 1.0, k) for t, k in zip((a, b, c), keys, strict=True)])
    assert torch.equal(store["backbone.w"][((1,), COMMON)], torch.tensor([3.0]))  # all three
    assert torch.equal(pick(store, keys[0])["head.w"], torch.tensor([30.0, 30.0]))  # a and c
    assert torch.equal(pick(store, keys[1])["head.w"], torch.tensor([30.0, 30.0]))  # b alone
