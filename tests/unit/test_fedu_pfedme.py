"""FedU, dFedU and pFedMe single steps with hand-computed values (docs/ALGORITHMS.md §6–8)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from raymtl.algorithms.base import FederationInfo, Message, State, StepContext
from raymtl.algorithms.fedu import DFedU, FedU, FedUParams, random_similarity
from raymtl.algorithms.pfedme import PFedMe, PFedMeParams, local_copy_step, moreau_step


def ctx(me: str, num_clients: int = 3, mixing=None) -> StepContext:
    federation = FederationInfo(
        num_clients, (1, 3, 1), (2,) * num_clients, (1, 1, 1), mixing=mixing
    )
    return StepContext(me=me, round=1, rounds=1, seed=0, sampled=(0, 1, 2), federation=federation)


def model_message(src: str, dst: str, value: float) -> Message:
    return Message(src, dst, "model", {"weight": torch.tensor([[value]])})


def test_reference_similarity_is_symmetric_thresholded_and_seeded():
    a = random_similarity(8, seed=1)
    assert np.array_equal(a, a.T) and np.all(np.diag(a) == 0)
    assert np.all((a == 0) | (a >= 0.25)) and (a > 0).any()
    assert np.array_equal(a, random_similarity(8, seed=1))
    assert not np.array_equal(a, random_similarity(8, seed=2))


def test_fedu_server_step_is_simultaneous_over_the_sampled_clients():
    params = FedUParams(lr=0.1, lam=0.5, epochs=2, similarity="ones")  # η·λ·R = 0.1
    inbox = [model_message(f"client/{k}", "server", v) for k, v in ((0, 0.0), (1, 1.0), (2, 4.0))]
    _, outbox = FedU(params, None).regularise(State(), inbox, ctx("server"))
    new = {m.dst: float(m.tensors["weight"]) for m in outbox}
    assert new["client/0"] == pytest.approx(0.5)  # 0 - 0.1·((0-1) + (0-4))
    assert new["client/1"] == pytest.approx(1.2)  # 1 - 0.1·((1-0) + (1-4))
    assert new["client/2"] == pytest.approx(3.3)  # 4 - 0.1·((4-0) + (4-1))


def test_fedu_uses_a_given_similarity():
    given = [[0, 1, 0], [1, 0, 0.5], [0, 0.5, 0]]
    params = FedUParams(lr=0.1, lam=1.0, epochs=1, similarity=given)
    inbox = [model_message(f"client/{k}", "server", v) for k, v in ((0, 0.0), (1, 1.0), (2, 4.0))]
    _, outbox = FedU(params, None).regularise(State(), inbox, ctx("server"))
    new = {m.dst: float(m.tensors["weight"]) for m in outbox}
    assert new["client/0"] == pytest.approx(0.1)  # 0 - 0.1·1·(0-1)
    assert new["client/1"] == pytest.approx(1.05)  # 1 - 0.1·(1·1 + 0.5·(1-4))
    assert new["client/2"] == pytest.approx(3.85)  # 4 - 0.1·0.5·3


def test_dfedu_peer_step_uses_the_neighbours_it_heard_from():
    params = FedUParams(lr=0.1, lam=0.5, epochs=2, similarity="ones")
    model = nn.Linear(1, 1, bias=False)
    state = State(model=model, extras={"sent": {"weight": torch.tensor([[1.0]])}})
    mixing = {0: {0: 0.5, 1: 0.5}, 1: {0: 0.3, 1: 0.4, 2: 0.3}, 2: {1: 0.5, 2: 0.5}}
    inbox = [model_message("client/0", "client/1", 0.0), model_message("client/2", "client/1", 4.0)]
    state, _ = DFedU(params, None).regularise(state, inbox, ctx("client/1", mixing=mixing))
    assert float(model.weight.detach()) == pytest.approx(1.2)  # 1 - 0.1·((1-0) + (1-4))


def test_pfedme_personal_and_local_steps():
    personal, local = nn.Linear(1, 1, bias=False), nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        personal.weight.fill_(1.0)
        local.weight.fill_(0.0)
    personal.weight.grad = torch.tensor([[2.0]])
    moreau_step(personal, local, lr_p=0.1, lam=15.0)
    assert float(personal.weight.detach()) == pytest.approx(-0.7)  # 1 - 0.1·(2 + 15·(1-0))
    local_copy_step(local, personal, lr=0.01, lam=15.0)
    assert float(local.weight.detach()) == pytest.approx(-0.105)  # 0 - 0.01·15·(0-(-0.7))


def test_pfedme_server_mixes_with_beta():
    algorithm = PFedMe(PFedMeParams(beta=0.5), model_factory=None)
    server = State(model=nn.Linear(1, 1, bias=False))
    with torch.no_grad():
        server.model.weight.fill_(0.0)
    inbox = [model_message("client/0", "server", 2.0), model_message("client/1", "server", 4.0)]
    server, outbox = algorithm.aggregate(server, inbox, ctx("server"))
    # Σ n_k w_k / n = (1·2 + 3·4) / 4 = 3.5; w = 0.5·0 + 0.5·3.5
    assert float(server.model.weight.detach()) == pytest.approx(1.75)
    (copy,) = outbox  # every client's evaluation copy, sent once
    assert copy.dst == "client/*" and float(copy.tensors["weight"]) == 1.75


def test_pfedme_evaluates_the_personal_model():
    algorithm = PFedMe(PFedMeParams(), model_factory=None)
    model = nn.Linear(1, 1)
    assert algorithm.eval_model(State(model=model)) is model
    personal = {"weight": torch.tensor([[2.0]]), "bias": torch.tensor([3.0])}  # θ̃ as tensors
    evaluated = algorithm.eval_model(State(model=model, extras={"personal": personal}))
    assert evaluated is not model and float(evaluated(torch.tensor([[1.0]])).detach()) == 5.0
    assert float(model.weight.detach()) != 2.0  # the local copy w is left as it was
