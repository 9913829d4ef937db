"""The natural partition (data/natural.py): each client holds exactly the samples the data
gives it, and raymtl's own per-client settings still apply on top."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raymtl.data.client_data import materialize
from raymtl.data.natural import natural
from raymtl.data.shards import ClientShard
from raymtl.data.source_registry import ClientKeys, Generated, Pool, check_pool

NAMES = ("ann", "bob", "cy")


def keyed_pool(test=None, group=None) -> Pool:
    """12 samples of 3 clients: ann holds 0, 3, 6, 9, bob 1, 4, 7, 10, cy the rest."""
    x = torch.arange(12 * 4, dtype=torch.uint8).reshape(12, 1, 2, 2)
    y = torch.tensor([0, 1, 2] * 4)
    keys = ClientKeys(np.arange(12) % 3, NAMES, test=test, group=group, where="t.npz")
    return check_pool("t", Pool(x, y, 3, ("a", "b", "c"), 255.0, "t", keys=keys))


def test_each_client_holds_exactly_its_samples():
    shards = natural(keyed_pool(), 3, seed=0, test_fraction=0.25)
    for k, shard in enumerate(shards):
        held = np.sort(np.concatenate([shard.train_idx, shard.test_idx]))
        assert held.tolist() == list(range(k, 12, 3))
        assert len(shard.test_idx) == 1 and shard.key == k


def test_a_given_test_split_is_kept():
    test = np.arange(12) >= 9  # samples 9, 10, 11: one per client
    shards = natural(keyed_pool(test=test), 3, seed=0)
    assert [s.test_idx.tolist() for s in shards] == [[9], [10], [11]]
    assert shards[0].train_idx.tolist() == [0, 3, 6]


def test_fewer_clients_take_the_first_and_more_are_refused():
    assert [s.client_id for s in natural(keyed_pool(), 2, seed=0)] == [0, 1]
    with pytest.raises(ValueError, match="data.num_clients: 4, but the data holds 3 clients"):
        natural(keyed_pool(), 4, seed=0)


def test_rotations_and_the_group_column_apply_on_top():
    group = np.array([1, 0, 1])
    rotated = natural(keyed_pool(group=group), 3, seed=0, rotations=[0, 90])
    assert [s.rotation for s in rotated] == [0, 90, 0]
    assert [s.task for s in rotated] == [1, 0, 1]  # the column gives each client its task
    grouped = natural(keyed_pool(group=group), 3, seed=0)
    assert [s.group for s in grouped] == [1, 0, 1]
    data = materialize(keyed_pool(), rotated[1], seed=0)
    pool = keyed_pool()
    upright = pool.x[torch.from_numpy(rotated[1].train_idx)].float() / 255
    assert torch.equal(data.train_x, torch.rot90(upright, 1, dims=(-2, -1)))


def test_the_cap_and_held_out_samples():
    capped = natural(keyed_pool(), 3, seed=0, max_samples_per_client=3, test_fraction=0.34)
    assert all(len(s.train_idx) + len(s.test_idx) == 3 for s in capped)
    held = natural(keyed_pool(), 3, seed=0, held_out=[0], test_fraction=0.34)
    assert sorted([*held[0].train_idx, *held[0].test_idx]) == [3, 6, 9]  # 0 is the public's


def test_a_client_too_small_is_named():
    with pytest.raises(ValueError, match="client 'ann' of t.npz holds 0 train / 4 test"):
        natural(keyed_pool(test=np.arange(12) % 3 == 0), 3, seed=0)


def test_a_pool_without_keys_is_refused():
    pool = Pool(torch.zeros(4, 1, 2, 2), torch.tensor([0, 1, 0, 1]), 2, ("a", "b"), 1.0, "p")
    with pytest.raises(ValueError, match="partition.kind: 'natural' needs data already split"):
        natural(pool, 2, seed=0)


def _make(client: int):
    return torch.full((5 + client, 1, 1, 2), float(client)), torch.zeros(
        5 + client, dtype=torch.long
    )


def test_generated_clients_split_their_counts_without_samples():
    counts = np.array([5, 6, 7])
    pool = Pool(
        torch.empty(0, 1, 1, 2),
        torch.empty(0, dtype=torch.long),
        1,
        ("0",),
        1.0,
        "gen",
        generated=Generated(counts, _make),
        inputs="vectors",
    )
    shards = natural(check_pool("gen", pool), 3, seed=0, test_fraction=0.2)
    assert [(len(s.train_idx), len(s.test_idx)) for s in shards] == [(4, 1), (5, 1), (6, 1)]
    assert isinstance(shards[2].train_idx, range)  # no index arrays on the driver


def test_a_shard_table_gives_back_every_shard_after_pickling():
    import pickle

    from raymtl.data.shards import ShardTable

    keyed = natural(keyed_pool(group=np.array([1, 0, 1])), 3, seed=0, rotations=[0, 90])
    generated = [ClientShard(k, range(4), range(4, 5), 0, 0, 0.0, 0, None, key=k) for k in (5, 9)]
    for shards in (keyed, generated):
        table = pickle.loads(pickle.dumps(ShardTable(shards)))
        assert list(table) == [f"client/{s.client_id}" for s in shards]
        for shard in shards:
            back = table[f"client/{shard.client_id}"]
            assert list(back.train_idx) == list(shard.train_idx)
            assert list(back.test_idx) == list(shard.test_idx)
            same = ("group", "rotation", "mask_prob", "task", "task_classes", "source", "key")
            assert all(getattr(back, f) == getattr(shard, f) for f in same)
