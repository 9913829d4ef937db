"""Clients' kept state as tensors: spilled beyond the budget and back bit-identical, shared
initial weights costing nothing, one working model serving many clients."""

from __future__ import annotations

import torch
from torch import nn

from raymtl.runtime.hosts.client_state import ClientStates, WorkingModels, tensor_bytes


def blob(seed: int) -> dict:
    generator = torch.Generator().manual_seed(seed)
    weights = {"w": torch.randn(64, 64, generator=generator), "b": torch.randn(64)}
    return {"model": weights, "extras": {"maps": {1: torch.randn(8, 8)}, "loss": 0.5}}


def test_blobs_beyond_the_budget_are_spilled_and_come_back_bit_identical(tmp_path):
    size = tensor_bytes(blob(0))
    assert size == (64 * 64 + 64 + 64) * 4
    store = ClientStates(budget=2.5 * size, spill_root=str(tmp_path))
    originals = {f"client/{i}": blob(i) for i in range(5)}
    for participant, value in originals.items():
        store.put(participant, value)
    report = store.report()
    # Two fit the budget; the three least recently used went to disk.
    assert report["clients_resident"] == 2 and report["clients_spilled"] == 3
    assert report["state_resident_bytes"] == 2 * size
    assert report["state_spilled_bytes"] == 3 * size
    assert len(list(store.folder().iterdir())) == 3
    back = store.get("client/0")  # read back from disk (and now resident)
    expected = originals["client/0"]
    for name, value in expected["model"].items():
        assert back["model"][name].dtype == value.dtype
        assert torch.equal(back["model"][name], value)
    assert torch.equal(back["extras"]["maps"][1], expected["extras"]["maps"][1])
    assert back["extras"]["loss"] == 0.5
    assert store.report()["clients_spilled"] == 3  # another one went out to make room
    store.close()
    assert not any(tmp_path.iterdir())


def test_a_client_at_its_initial_weights_points_at_the_template_and_costs_nothing():
    model = nn.Linear(4, 3)
    working = WorkingModels()
    working.adopt(("linear", 3), model)
    template = working.templates[("linear", 3)]
    fresh = nn.Linear(4, 3)
    fresh.load_state_dict(model.state_dict())
    assert working.weights(("linear", 3), fresh) is template
    with torch.no_grad():
        fresh.bias.add_(1.0)
    changed = working.weights(("linear", 3), fresh)
    assert changed["weight"] is template["weight"] and changed["bias"] is not template["bias"]
    store = ClientStates()
    store.shared.update(id(t) for t in template.values())
    store.put("client/0", {"model": template, "extras": {}})
    store.put("client/1", {"model": changed, "extras": {}})
    assert store.sizes == {"client/0": 0, "client/1": 3 * 4}


def test_one_working_model_serves_every_client_and_copies_a_shared_model_in_once():
    working = WorkingModels()
    working.adopt(("linear", 2), nn.Linear(2, 2))
    model = working.models[("linear", 2)]
    shared = {"weight": torch.ones(2, 2), "bias": torch.zeros(2)}
    copies = []
    original = model.load_state_dict
    model.load_state_dict = lambda *a, **k: copies.append(1) or original(*a, **k)
    for _ in range(100):  # 100 clients evaluated with one global model
        assert working.load(("linear", 2), shared) is model
    assert len(copies) == 1 and torch.equal(model.weight, torch.ones(2, 2))
    working.touched(("linear", 2))  # a step trained it: the next client reloads
    working.load(("linear", 2), shared)
    assert len(copies) == 2
    working.load(("linear", 2))  # None: the initial weights
    assert not torch.equal(model.weight, torch.ones(2, 2))


def test_a_checkpoint_reads_spilled_blobs_without_making_them_resident(tmp_path):
    store = ClientStates(budget=tensor_bytes(blob(0)), spill_root=str(tmp_path))
    for i in range(3):
        store.put(f"client/{i}", blob(i))
    assert list(store.resident) == ["client/2"]
    peeked = store.peek("client/0")
    assert torch.equal(peeked["model"]["w"], blob(0)["model"]["w"])
    assert list(store.resident) == ["client/2"] and "client/0" in store.spilled
    store.close()


def test_weights_read_back_share_the_template_again():
    working = WorkingModels()
    working.adopt(("linear", 3), nn.Linear(4, 3))
    template = working.templates[("linear", 3)]
    copied = {name: value.clone() for name, value in template.items()}
    assert working.share(("linear", 3), copied) is template
    copied["bias"] = copied["bias"] + 1
    shared = working.share(("linear", 3), copied)
    assert shared["weight"] is template["weight"] and shared["bias"] is copied["bias"]
