"""A client's evaluation numbers do not depend on which other clients its host holds.

The same clients are evaluated grouped as on hosts of 5 and of 10 clients, round-robin over
3 hosts, and all on one host; each client's loss and accuracy must be bitwise the same in
every layout. On a CPU a forward's rounding depends on the shapes it sees (a batch of 1, 2
or 3 rows takes other kernels than one of 128; NHWC other than NCHW), so every layout must
give every client the same shapes: `evaluate_together` runs batches of exactly `batch` rows
and picks channels-last per model, `evaluate_stacked` runs fixed chunk and row shapes chosen
from each client's own test-set size.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import raymtl.tasks.objectives as objectives
from raymtl.models.registry import build_model
from raymtl.tasks.objectives import evaluate_stacked, evaluate_together

# Uneven test sets: one-sample clients, an empty one, two over a batch of 128. The first host
# of 5 holds 6 samples in all (less than a batch), the last of 10 holds one client of 260.
SIZES = [1, 1, 2, 1, 1, 7, 130, 0, 3, 1, 260, 2, 5, 64, 1, 17, 4, 9, 1, 40]
# MNIST's images; resnet8 (the costliest pass) on small colour ones.
SHAPES = {
    "logreg": (1, 28, 28),
    "mlp": (1, 28, 28),
    "cnn_mnist": (1, 28, 28),
    "resnet8": (3, 8, 8),
}


def layouts(count: int) -> dict[str, list[list[int]]]:
    """Client indices per host: hosts of 5, hosts of 10, round-robin over 3 hosts."""
    clients = list(range(count))
    return {
        "hosts_of_5": [clients[k : k + 5] for k in range(0, count, 5)],
        "hosts_of_10": [clients[k : k + 10] for k in range(0, count, 10)],
        "round_robin_3": [clients[k::3] for k in range(3)],
    }


def client_tests(shape: tuple[int, int, int]) -> list[tuple[torch.Tensor, torch.Tensor, None]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.rand(n, *shape, generator=generator), torch.randint(0, 10, (n,)), None)
        for n in SIZES
    ]


def model_with_statistics(name: str, seed: int) -> nn.Module:
    """`name` at random weights; BatchNorm's running statistics made non-trivial, so that
    they take part in every output."""
    torch.manual_seed(seed)
    model = build_model(name, SHAPES[name], 10)
    for module in model.modules():
        if isinstance(module, nn.modules.batchnorm._BatchNorm):
            module.running_mean.uniform_(-0.2, 0.2)
            module.running_var.uniform_(0.5, 2.0)
    return model.eval()


def by_client(evaluate, tests: list, hosts: list[list[int]]) -> dict[int, dict]:
    """`evaluate(indices, tests of those clients)` host by host, each client's metrics."""
    results = {}
    for host in hosts:
        results.update(zip(host, evaluate(host, [tests[k] for k in host]), strict=True))
    return results


def assert_layouts_bitwise_equal(evaluate, tests: list) -> None:
    reference = by_client(evaluate, tests, [list(range(len(tests)))])
    for layout, hosts in layouts(len(tests)).items():
        results = by_client(evaluate, tests, hosts)
        differing = [k for k in reference if results[k] != reference[k]]  # == on floats: bits
        assert not differing, f"{layout}: clients {differing} differ from one host's numbers"


@pytest.mark.parametrize("name", ["logreg", "mlp", "cnn_mnist", "resnet8"])
def test_one_shared_model_gives_each_client_the_same_numbers_in_every_layout(name):
    model = model_with_statistics(name, seed=0)
    tests = client_tests(SHAPES[name])
    assert_layouts_bitwise_equal(lambda _, host_tests: evaluate_together(model, host_tests), tests)


@pytest.mark.parametrize("stack", [True, False], ids=["vmapped", "one_by_one"])
@pytest.mark.parametrize("name", ["logreg", "mlp", "resnet8"])
def test_own_weights_give_each_client_the_same_numbers_in_every_layout(name, stack, monkeypatch):
    # STACK_BYTES decides between the two paths (cnn_mnist's 6.6 MB always takes the second,
    # one functional call per client, which the three models here are checked on as well).
    monkeypatch.setattr(objectives, "STACK_BYTES", float("inf") if stack else 0)
    models = [model_with_statistics(name, seed=k) for k in range(len(SIZES))]
    weights = [{key: t.detach().clone() for key, t in m.state_dict().items()} for m in models]
    skeleton = model_with_statistics(name, seed=100)  # a module of the architecture only

    def evaluate(host: list[int], host_tests: list) -> list[dict]:
        return evaluate_stacked(skeleton, [weights[k] for k in host], host_tests)

    assert_layouts_bitwise_equal(evaluate, client_tests(SHAPES[name]))
