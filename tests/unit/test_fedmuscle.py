"""FedMuscle's maths against direct loops over every tuple, its budget refusals, and the data
it needs (a public set held out of every client, a task on another domain). No Ray."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from raymtl.algorithms.base import FederationInfo
from raymtl.algorithms.fedmuscle import FedMuscle, FedMuscleParams, PairwiseInfoNCE
from raymtl.algorithms.muscle import (
    gamma_of,
    muscle_loss,
    muscle_loss_from_partners,
    pairwise_infonce,
    positive_index,
    tuple_targets,
)
from raymtl.config import ConfigError, parse_config
from raymtl.data import load_pool
from raymtl.data.domains import partition_sources, public_indices
from raymtl.data.sources import Pool
from raymtl.runtime.executors.planning import check_federation, partition
from tests.conftest import digits_experiment

TAU, TAU_PRIME = 0.2, 0.15
GAMMA = 1 / TAU_PRIME - 1 / TAU


def unit_rows(*shape, seed=0):
    return F.normalize(torch.randn(*shape, generator=torch.Generator().manual_seed(seed)), dim=-1)


def loop_alpha(partners, j):
    """α_j = exp(−γ Σ_{k<l} z^{m_k}_{j_k}·z^{m_l}_{j_l}), one tuple at a time."""
    count = partners.shape[0]
    pairs = itertools.combinations(range(count), 2)
    return math.exp(-GAMMA * sum(float(partners[k, j[k]] @ partners[m, j[m]]) for k, m in pairs))


def loop_muscle(z, partners):
    """−(1/B) Σ_i log[α_(i..i) e^{z_i·S_(i..i)/τ} / Σ_j α_j e^{z_i·S_j/τ}] over all tuples."""
    count, size = partners.shape[:2]
    total = 0.0
    for i in range(size):
        terms = {}
        for j in itertools.product(range(size), repeat=count):
            s_j = sum(partners[k, j[k]] for k in range(count))
            terms[j] = loop_alpha(partners, j) * math.exp(float(z[i] @ s_j) / TAU)
        total -= math.log(terms[(i,) * count] / sum(terms.values()))
    return total / size


def test_gamma_is_positive_with_the_paper_temperatures():
    assert gamma_of(TAU, TAU_PRIME) == pytest.approx(5 / 3)


@pytest.mark.parametrize("count", [1, 2, 3])
def test_tuples_and_weights_have_one_row_per_tuple(count):
    partners = unit_rows(count, 3, 4)
    tuples, alpha = tuple_targets(partners, GAMMA)
    assert tuples.shape == (3**count, 4) and alpha.shape == (3**count,)
    for flat, j in enumerate(itertools.product(range(3), repeat=count)):  # row-major order
        assert torch.allclose(tuples[flat], sum(partners[k, j[k]] for k in range(count)))
        assert float(alpha[flat]) == pytest.approx(loop_alpha(partners, j), rel=1e-5)
    assert positive_index(3, count).tolist() == [
        flat for flat, j in enumerate(itertools.product(range(3), repeat=count)) if len(set(j)) == 1
    ]


def test_muscle_loss_matches_the_loop_over_all_tuples():
    z, partners = unit_rows(3, 4, seed=1), unit_rows(2, 3, 4, seed=2)  # B = 3, M = 2, d = 4
    tuples, alpha = tuple_targets(partners, GAMMA)
    expected = loop_muscle(z, partners)
    assert float(muscle_loss(z, tuples, alpha, TAU, 2)) == pytest.approx(expected, rel=1e-5)
    from_partners = muscle_loss_from_partners(z, partners, TAU, GAMMA)
    assert float(from_partners) == pytest.approx(expected, rel=1e-5)


def test_with_one_partner_and_no_weights_muscle_is_infonce():
    z, partners = unit_rows(3, 4, seed=3), unit_rows(1, 3, 4, seed=4)
    tuples, alpha = tuple_targets(partners, GAMMA)
    assert torch.equal(alpha, torch.ones(3))  # no pair of partners: α ≡ 1
    infonce = pairwise_infonce(z, partners, TAU)
    assert float(muscle_loss(z, tuples, alpha, TAU, 1)) == pytest.approx(float(infonce), rel=1e-6)


def test_pairwise_infonce_sums_cross_entropies_over_partners():
    z, partners = unit_rows(3, 4, seed=5), unit_rows(2, 3, 4, seed=6)
    expected = 0.0
    for other in partners:
        for i in range(3):
            logits = [float(z[i] @ other[j]) / TAU for j in range(3)]
            expected -= logits[i] - math.log(sum(math.exp(v) for v in logits))
    assert float(pairwise_infonce(z, partners, TAU)) == pytest.approx(expected / 3, rel=1e-6)


def test_only_the_anchor_gets_a_gradient():
    z = unit_rows(3, 4, seed=7).requires_grad_()
    partners = unit_rows(2, 3, 4, seed=8).requires_grad_()
    tuples, alpha = tuple_targets(partners.detach(), GAMMA)
    muscle_loss(z, tuples, alpha, TAU, 2).backward()
    assert z.grad is not None and partners.grad is None


def federation(num_clients=6, public_size=1000):
    return FederationInfo(
        num_clients, (10,) * num_clients, (10,) * num_clients, (1, 28, 28), public_size=public_size
    )


def test_the_paper_setting_fits_and_four_partners_are_refused():
    FedMuscle(FedMuscleParams(), None).check_resources(federation(), 2**34)  # 33.7 MB a client
    with pytest.raises(ValueError, match=r"1,028\.0 MiB .*32\^4·257.* partners \(M\)"):
        FedMuscle(FedMuscleParams(partners=4), None).check_resources(federation(), 2**40)


def test_the_server_memory_for_the_tuples_is_refused_above_the_budget():
    with pytest.raises(ValueError, match=r"server holds 192\.8 MiB .*6 clients.*budget 100 MiB"):
        FedMuscle(FedMuscleParams(), None).check_resources(federation(), 100 * 2**20)


def test_the_partner_downlink_fits_where_tuples_do_not():
    params = FedMuscleParams(partners=4, downlink="partners")
    FedMuscle(params, None).check_resources(federation(), 2**30)
    PairwiseInfoNCE(PairwiseInfoNCE.Params(), None).check_resources(federation(50), 2**30)


def test_a_public_batch_larger_than_the_public_set_is_refused():
    with pytest.raises(ValueError, match=r"public_batch: B = 32 exceeds data.public.size \(20\)"):
        FedMuscle(FedMuscleParams(), None).check_resources(federation(public_size=20), 2**34)


def muscle_experiment(tmp_path, **overrides):
    settings = {
        "algorithm.name": "fedmuscle",
        "data.partition": {"kind": "iid", "max_samples_per_client": 60},
        "data.public": {"size": 200},
        **overrides,
    }
    return parse_config(digits_experiment(tmp_path, **settings))


def test_a_config_over_the_downlink_budget_fails_before_ray(tmp_path):
    cfg = muscle_experiment(tmp_path, **{"algorithm.params": {"partners": 4}})
    with pytest.raises(ConfigError, match=r"^algorithm.params: fedmuscle sends 1,028\.0 MiB"):
        check_federation(cfg)


def test_fedmuscle_without_public_data_is_refused(tmp_path):
    with pytest.raises(ConfigError, match=r"^data.public: fedmuscle aligns clients on a public"):
        parse_config(digits_experiment(tmp_path, **{"algorithm.name": "fedmuscle"}))


def test_the_public_set_comes_from_the_test_split_and_no_client_holds_it(tmp_path):
    pool = Pool(
        torch.zeros(100, 1, 2, 2),
        torch.arange(100) % 10,
        10,
        tuple("0123456789"),
        1.0,
        "test",
        test_start=60,
    )
    picked = public_indices(pool, "test", 20, seed=0)
    assert len(set(picked.tolist())) == 20 and picked.min() >= 60
    with pytest.raises(ValueError, match=r"data.public.size: 21 is more than half the 40 test"):
        public_indices(pool, "test", 21, seed=0)
    cfg = muscle_experiment(tmp_path)
    pools, shards, public = partition_sources(cfg.data, 0, lambda name: load_pool(name))
    held = {int(i) for s in shards for i in np.concatenate([s.train_idx, s.test_idx])}
    assert public.source == "digits" and len(public.indices) == 200
    assert not held & set(public.indices.tolist())


def test_the_public_set_changes_no_partition_without_one(tmp_path):
    cfg = muscle_experiment(tmp_path, **{"algorithm.name": "local", "data.public": None})
    _, shards, _, public = partition(cfg, 0)
    from raymtl.data import partition_clients

    plain = partition_clients(
        load_pool("digits").y.numpy(), 10, num_clients=6, seed=0, **cfg.data.partition.model_dump()
    )
    assert public is None
    assert all(np.array_equal(a.train_idx, b.train_idx) for a, b in zip(shards, plain, strict=True))


def test_a_task_on_another_domain_is_resized_to_the_main_images(tmp_path):
    tasks = [{"name": "shapes", "clients": 4}, {"name": "digits", "source": "digits", "clients": 2}]
    cfg = muscle_experiment(
        tmp_path,
        **{
            "data.name": "synthetic",
            "data.params": {"shape": [1, 12, 12]},
            "data.tasks": tasks,
            "data.public": {"size": 100},
            "data.partition": {"kind": "iid"},
        },
    )
    _, shards, specs, public = partition(cfg, 0)
    assert [s.source for s in shards] == [None] * 4 + ["digits"] * 2
    assert public.source == "synthetic" and [s.name for s in specs] == ["shapes", "digits"]
    from raymtl.data import materialize

    data = materialize(load_pool("digits"), shards[5], 0, specs[1], (1, 12, 12))
    assert data.train_x.shape[1:] == (1, 12, 12) and data.train_x.max() <= 1.0
    assert set(data.train_y.tolist()) <= set(range(10))


def test_a_domain_with_other_channels_is_refused(tmp_path):
    tasks = [{"name": "a", "clients": 4}, {"name": "b", "source": "digits", "clients": 2}]
    cfg = muscle_experiment(
        tmp_path,
        **{
            "data.name": "synthetic",
            "data.params": {"shape": [3, 8, 8]},
            "data.tasks": tasks,
            "data.partition": {"kind": "iid"},
        },
    )
    with pytest.raises(ConfigError, match=r"digits has 1 channel\(s\), data.name synthetic has 3"):
        partition(cfg, 0)
