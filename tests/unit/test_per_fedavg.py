"""Per-FedAvg's MAML step, round and evaluation with hand-computed values (docs/ALGORITHMS.md)."""

from __future__ import annotations

import math

import pytest
import torch
from pydantic import ValidationError
from torch import nn

from raymtl.algorithms.base import (
    FederationInfo,
    Message,
    State,
    StepContext,
    payload_bits,
)
from raymtl.algorithms.per_fedavg import (
    PerFedAvg,
    PerFedAvgParams,
    batch_stream,
    maml_step,
    support_batch,
)
from raymtl.algorithms.registry import all_algorithms
from raymtl.data.client_data import ClientData


def squared(model, x, y):
    """f(w; (x, y)) = mean (w·x − y)²: ∇f = 2x(wx − y), ∇²f = 2x² for one sample."""
    return ((model(x) - y) ** 2).mean()


def scalar_model(value: float) -> nn.Linear:
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(value)
    return model


def sample(x: float, y: float):
    return torch.tensor([[x]]), torch.tensor([[y]])


def weight(model: nn.Module) -> float:
    return float(model.weight.detach())


D, D_META, D_HESSIAN = sample(1.0, 0.0), sample(2.0, 1.0), sample(1.0, 3.0)


def test_first_order_step():
    model, p = scalar_model(1.0), PerFedAvgParams(alpha=0.1, beta=0.5)
    loss = maml_step(model, [D, D_META], p, squared)
    # ∇f(1; D) = 2·1·(1 − 0) = 2, w̃ = 1 − 0.1·2 = 0.8
    # ∇f(0.8; D') = 2·2·(1.6 − 1) = 2.4, w = 1 − 0.5·2.4 = −0.2
    assert weight(model) == pytest.approx(-0.2)
    assert loss == pytest.approx(0.36)  # f(w̃; D') = (1.6 − 1)²


def test_hessian_step_uses_the_exact_hessian_vector_product():
    model, p = scalar_model(1.0), PerFedAvgParams(alpha=0.1, beta=0.5, variant="hf")
    maml_step(model, [D, D_META, D_HESSIAN], p, squared)
    # v = ∇f(w̃; D') = 2.4 as above; ∇²f(1; D'') = 2·1² = 2
    # w = 1 − 0.5·(1 − 0.1·2)·2.4 = 1 − 0.96 = 0.04
    assert weight(model) == pytest.approx(0.04)


def test_hessian_step_on_cross_entropy():
    """A 1→2 linear classifier at W = 0, x = 1, label 0, D = D' = D'': softmax p = (½, ½)."""
    x, y = torch.tensor([[1.0]]), torch.tensor([0])
    ce = lambda net, a, b: nn.functional.cross_entropy(net(a), b)  # noqa: E731
    for variant, expected in (("fo", 0.5 * 0.475021), ("hf", 0.5 * 0.451270)):
        model = nn.Linear(1, 2, bias=False)
        nn.init.zeros_(model.weight)
        maml_step(model, [(x, y)] * 3, PerFedAvgParams(alpha=0.1, beta=0.5, variant=variant), ce)
        # ∇f(0) = (p − e_0)·x = (−½, ½): W̃ = (0.05, −0.05), p̃_0 = σ(0.1) = 0.524979
        # v = ∇f(W̃) = (−0.475021, 0.475021); H(0) = diag(p) − ppᵀ = ¼·[[1, −1], [−1, 1]]
        # Hv = (−0.2375105, 0.2375105); (I − 0.1·H)v = (−0.451270, 0.451270); W = −0.5·that
        torch.testing.assert_close(
            model.weight.detach(), torch.tensor([[expected], [-expected]]), atol=1e-6, rtol=0
        )


def test_local_steps_and_batches():
    assert PerFedAvgParams().steps(1000) == 10  # the paper's τ
    epochs = PerFedAvgParams(local_steps=None, epochs=2, batch_size=10)
    assert epochs.steps(45) == 5  # 2·⌈45/10⌉ = 10 batches, 2 a step
    assert epochs.model_copy(update={"variant": "hf"}).steps(45) == 3  # 3 a step
    assert PerFedAvgParams(local_steps=None, batch_size=100).steps(5) == 1  # at least one
    with pytest.raises(ValidationError):
        PerFedAvgParams(variant="so")
    with pytest.raises(ValidationError):
        PerFedAvgParams(lr=0.1)  # α and β, no lr
    x, y = torch.arange(5.0).unsqueeze(1), torch.arange(5)
    stream = batch_stream(x, y, 2, seed=3)
    drawn = torch.cat([next(stream)[1] for _ in range(6)])  # 2 permutations of 5 in 2+2+1
    assert sorted(drawn[:5].tolist()) == list(range(5)) == sorted(drawn[5:10].tolist())
    again = batch_stream(x, y, 2, seed=3)
    assert torch.equal(torch.cat([next(again)[1] for _ in range(6)]), drawn)


def client_data(n: int = 1) -> ClientData:
    x, y = torch.ones(n, 1), torch.zeros(n, dtype=torch.long)
    return ClientData(x, y, x.clone(), y.clone(), num_classes=2, input_shape=(1, 1, 1))


def ctx(me: str, samples=(1, 3)) -> StepContext:
    federation = FederationInfo(len(samples), samples, (2,) * len(samples), (1, 1, 1))
    return StepContext(me=me, round=1, rounds=1, seed=0, sampled=(0, 1), federation=federation)


def classifier() -> nn.Linear:
    model = nn.Linear(1, 2)  # weight 2×1 and bias 2: |w| = 4
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)
    return model


def test_train_is_one_maml_step_from_the_received_model_and_sends_it():
    algorithm = PerFedAvg(PerFedAvgParams(alpha=0.1, beta=0.5, local_steps=1), None)
    state = State(model=nn.Linear(1, 2), data=client_data())
    zero = {"weight": torch.zeros(2, 1), "bias": torch.zeros(2)}
    state, outbox = algorithm.train(
        state, [Message("server", "client/0", "m", zero)], ctx("client/0")
    )
    # one sample x = 1, label 0, so D = D' = it: weight and bias each move by the fo step of
    # test_hessian_step_on_cross_entropy (the bias' input is 1 too, so its gradient is equal;
    # the logits are z = (w_0 + b_0, w_1 + b_1), so W̃ = b̃ = (0.05, −0.05), p̃_0 = σ(0.2))
    p0 = 1 / (1 + math.exp(-0.2))
    step = 0.5 * (1 - p0)
    [message] = outbox
    assert (message.src, message.dst, message.kind) == ("client/0", "server", "model")
    torch.testing.assert_close(message.tensors["weight"], torch.tensor([[step], [-step]]))
    torch.testing.assert_close(message.tensors["bias"], torch.tensor([step, -step]))
    assert payload_bits(message.tensors) == 4 * 32  # |w|·32 up per sampled client


def test_round_bits_and_sample_weighted_average():
    algorithm = PerFedAvg(PerFedAvgParams(), None)
    server = State(model=classifier())
    _, down = algorithm.broadcast(server, [], ctx("server"))
    assert [m.dst for m in down] == ["client/0", "client/1"]
    assert all(payload_bits(m.tensors) == 4 * 32 for m in down)  # |w|·32 down per client
    models = [
        Message(f"client/{k}", "server", "model", {"weight": torch.full((2, 1), v)})
        for k, v in ((1, 4.0), (0, 2.0))
    ]
    server, copies = algorithm.aggregate(server, models, ctx("server"))
    # (1·2 + 3·4) / 4 = 3.5; evaluation copies to every client are not traffic
    assert torch.equal(server.model.weight.detach(), torch.full((2, 1), 3.5))
    (copy,) = copies  # every client's evaluation copy, sent once
    assert copy.evaluation_only and copy.dst == "client/*"


def test_evaluation_adapts_a_copy_with_one_step_on_the_support_batch():
    algorithm = PerFedAvg(PerFedAvgParams(alpha=0.1), None)
    model, data = classifier(), client_data(n=3)  # identical samples: x = 1, label 0
    evaluated = algorithm.eval_model(State(model=model, data=data))
    # w − α∇f(w; D_i) at w = 0, p = (½, ½): weight and bias (0.05, −0.05)
    assert evaluated is not model
    torch.testing.assert_close(evaluated.weight.detach(), torch.tensor([[0.05], [-0.05]]))
    torch.testing.assert_close(evaluated.bias.detach(), torch.tensor([0.05, -0.05]))
    assert not model.weight.detach().any() and not model.bias.detach().any()  # state kept
    again = algorithm.eval_model(State(model=model, data=data))
    assert torch.equal(again.weight.detach(), evaluated.weight.detach())
    assert torch.equal(support_batch(50, 8), support_batch(50, 8))  # seeded, deterministic
    assert len(support_batch(50, 8)) == 8 and len(support_batch(5, 8)) == 5


def test_evaluation_under_no_grad_and_registration():
    algorithm = PerFedAvg(PerFedAvgParams(alpha=0.1), None)
    model = classifier()
    with torch.no_grad():  # evaluation may run without autograd: the step still happens
        evaluated = algorithm.eval_model(State(model=model, data=client_data()))
    assert float(evaluated.bias.detach()[0]) == pytest.approx(0.05)
    assert all_algorithms()["per_fedavg"] is PerFedAvg and PerFedAvg.keeps == ()
