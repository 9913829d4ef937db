"""The batched Laplacian step (one matrix product) against the pairwise loop it replaced.

`reference_laplacian_step` is the pre-change code of raymtl.algorithms.fedu.laplacian_step,
kept here (not in the package) as the reference.

Tolerance, per entry of row k, from the two summation orders (u = unit roundoff: 2⁻²⁴ in
float32, 2⁻⁵³ in float64; n = neighbours k reads; s = step; first order in u):
    loop:    n updates v ← v − fl(fl(w_k − w_l)·fl(s·a_kl)), each rounding the increment
             (3 roundings) and the running value: |loop − exact| ≤ (n + 3)·u·B
    product: Σ_c M_kc·x_c over n + 1 terms with M rounded once: |product − exact| ≤ (n + 2)·u·B
    where B = |w_k| + s·Σ_l |a_kl|·(|w_k| + |w_l|) bounds every term either sum adds
    (|1 − s·d_k|·|w_k| ≤ |w_k| + s·Σ|a_kl|·|w_k|, |w_k − w_l| ≤ |w_k| + |w_l|),
so |product − loop| ≤ 2·(n + 3)·u·B. It is a worst case: the observed gaps are far below it
(test_the_tolerance_is_not_vacuous shows a step missing one neighbour fails it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from raymtl.algorithms import fedu
from raymtl.algorithms.base import FederationInfo, Message, State, StepContext
from raymtl.algorithms.fedu import (
    FedUParams,
    laplacian_step,
    mixing_matrix,
    similarity_matrix,
    similarity_rows,
)
from raymtl.algorithms.sfmtl_graph import SFMTLGraph, SFMTLGraphParams, community_weights

Tensors = dict[str, torch.Tensor]

SHAPES = {"scalar": (), "bias": (7,), "matrix": (3, 5), "conv": (4, 2, 3, 3), "long": (3000,)}


def reference_laplacian_step(
    models: dict[int, Tensors], weights: dict[int, dict[int, float]], step: float
) -> dict[int, Tensors]:
    """The pre-change pairwise loop (O(S²·d) Python-level elementwise work), verbatim."""
    updated, scratch = {}, {}
    for k in sorted(weights):
        own = models[k]
        new = {name: value.clone() for name, value in own.items()}
        for l_ in sorted(weights.get(k, {})):
            a = weights[k][l_]
            if l_ == k or a == 0 or l_ not in models:
                continue
            for name, value in new.items():
                buffer = scratch.setdefault(name, torch.empty_like(own[name]))
                torch.sub(own[name], models[l_][name], out=buffer)
                value.sub_(buffer.mul_(step * a))
        updated[k] = new
    return updated


def random_models(count: int, seed: int, dtype=torch.float32) -> dict[int, Tensors]:
    """Client ids 0, 2, 4, … (gaps, like a sample); one transposed (non-contiguous) tensor."""
    generator = torch.Generator().manual_seed(seed)
    models = {}
    for k in range(0, 2 * count, 2):
        tensors = {n: torch.randn(s, generator=generator, dtype=dtype) for n, s in SHAPES.items()}
        tensors["matrix"] = torch.randn(5, 3, generator=generator, dtype=dtype).T
        models[k] = tensors
    return models


def random_weights(models, seed: int, rows=None) -> dict[int, dict[int, float]]:
    """Dense a_kl in [−0.2, 1] with zeros, self-weights and neighbours absent from `models`."""
    rng = np.random.default_rng(seed)
    present = sorted(models)
    neighbours = present + [max(present) + 1, max(present) + 3]  # two never in `models`
    weights = {}
    for k in present if rows is None else rows:
        row = {l_: float(rng.uniform(-0.2, 1.0)) for l_ in neighbours}
        for l_ in rng.choice(neighbours, size=len(neighbours) // 3, replace=False):
            row[int(l_)] = 0.0
        row[k] = 0.7  # a self-weight: skipped
        weights[k] = row
    return weights


def error_bound(models, weights, step: float, k: int, name: str) -> torch.Tensor:
    """2·(n + 3)·u·B for row k (module docstring)."""
    own = models[k][name].double()
    used = {l_: a for l_, a in weights[k].items() if l_ != k and a != 0 and l_ in models}
    bound = own.abs().clone()
    for l_, a in used.items():
        bound += abs(step * a) * (own.abs() + models[l_][name].double().abs())
    unit = torch.finfo(models[k][name].dtype).eps / 2
    return 2 * (len(used) + 3) * unit * bound


def assert_matches_reference(models, weights, step: float) -> float:
    """New against the loop, entry by entry within the bound; the largest gap / bound."""
    new = laplacian_step(models, weights, step)
    old = reference_laplacian_step(models, weights, step)
    assert new.keys() == old.keys() == weights.keys()
    worst = 0.0
    for k in old:
        assert new[k].keys() == old[k].keys()
        for name in old[k]:
            assert new[k][name].shape == old[k][name].shape
            assert new[k][name].dtype == old[k][name].dtype
            gap = (new[k][name].double() - old[k][name].double()).abs()
            bound = error_bound(models, weights, step, k, name)
            assert bool((gap <= bound).all()), (k, name, float((gap - bound).max()))
            worst = max(worst, float((gap / bound.clamp_min(1e-300)).max()))
    return worst


@pytest.mark.parametrize("count", [1, 2, 5, 40])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_matches_the_pairwise_loop(count, dtype):
    models = random_models(count, seed=count, dtype=dtype)
    weights = random_weights(models, seed=count)
    assert assert_matches_reference(models, weights, step=0.03) <= 1.0


def test_matches_across_block_boundaries(monkeypatch):
    """Blocks of 1,024 entries: the 3,000-entry tensor spans three, the last one short."""
    monkeypatch.setattr(fedu, "BLOCK_VALUES", 64)
    models = random_models(6, seed=3)
    assert assert_matches_reference(models, random_weights(models, seed=3), step=0.1) <= 1.0


def test_the_tolerance_is_not_vacuous():
    """A step that forgets one neighbour is far outside the bound."""
    models = random_models(10, seed=5)
    weights = random_weights(models, seed=5)
    k = 0
    dropped = next(l_ for l_, a in weights[k].items() if l_ != k and a != 0 and l_ in models)
    wrong = reference_laplacian_step(models, {k: {**weights[k], dropped: 0.0}}, 0.03)[k]
    new = laplacian_step(models, weights, 0.03)[k]
    gap = (new["long"].double() - wrong["long"].double()).abs()
    assert float((gap / error_bound(models, weights, 0.03, k, "long")).max()) > 100


def test_single_participant_keeps_its_model_in_a_new_tensor():
    models = random_models(1, seed=0)
    new = laplacian_step(models, {0: {0: 1.0, 5: 0.4}}, step=0.5)  # self and absent only
    for name, value in models[0].items():
        assert torch.equal(new[0][name], value) and new[0][name] is not value


def test_only_the_rows_asked_for_are_computed():
    """dFedU's call: one row, reading k and the neighbours it weights."""
    models = random_models(8, seed=7)
    weights = random_weights(models, seed=7, rows=[4])
    assert laplacian_step(models, weights, 0.05).keys() == {4}
    assert assert_matches_reference(models, weights, step=0.05) <= 1.0


def test_inputs_are_untouched_and_the_update_is_simultaneous():
    models = {
        0: {"w": torch.tensor([0.0])},
        1: {"w": torch.tensor([1.0])},
        2: {"w": torch.tensor([3.0])},
    }
    s = {0: {1: 1.0, 2: 0.5}, 1: {0: 1.0, 2: 0.2}, 2: {0: 0.5, 1: 0.2}}
    new = laplacian_step(models, s, step=0.1)
    assert float(new[0]["w"]) == pytest.approx(0.25)  # 0 − 0.1·(1·(0−1) + 0.5·(0−3))
    assert float(new[1]["w"]) == pytest.approx(0.94)  # 1 − 0.1·(1·(1−0) + 0.2·(1−3))
    assert float(new[2]["w"]) == pytest.approx(2.81)  # 3 − 0.1·(0.5·3 + 0.2·2)
    assert [float(m["w"]) for m in models.values()] == [0.0, 1.0, 3.0]


def test_mixing_matrix_is_identity_minus_step_times_laplacian():
    used = {0: {1: 1.0, 2: 0.5}, 1: {0: 1.0}}
    mixing = mixing_matrix([0, 1], [0, 1, 2], used, step=0.1)
    # M = I − 0.1·(D − A) on rows 0, 1: d_0 = 1.5, d_1 = 1
    assert np.allclose(mixing, [[0.85, 0.1, 0.05], [0.1, 0.9, 0.0]])


def test_a_non_finite_model_reaches_only_the_rows_that_read_it():
    models = random_models(4, seed=9)  # ids 0, 2, 4, 6
    models[6] = {name: torch.full_like(value, float("inf")) for name, value in models[6].items()}
    models[6]["bias"][0] = float("nan")
    weights = {0: {2: 0.5, 6: 0.0}, 2: {0: 0.5, 6: 0.3}, 4: {6: 0.0}, 6: {0: 0.2}}
    new = laplacian_step(models, weights, step=0.1)
    old = reference_laplacian_step(models, weights, step=0.1)
    for k in (0, 4):  # weight 0 on the inf model: untouched by it, and equal to the loop
        assert all(bool(torch.isfinite(t).all()) for t in new[k].values())
    assert assert_matches_reference(models, {0: weights[0], 4: weights[4]}, step=0.1) <= 1.0
    # Reading it (or being it): non-finite exactly where the loop is (inf or NaN may differ:
    # own inf − step·a·(inf − w_0) is NaN in the loop, (1 − step·a)·inf + step·a·w_0 = inf here).
    for k in (2, 6):
        for name in old[k]:
            assert torch.equal(torch.isfinite(new[k][name]), torch.isfinite(old[k][name]))
        assert not bool(torch.isfinite(new[k]["long"]).any())


def test_half_precision_is_mixed_in_float32_and_rounded_back():
    models = random_models(5, seed=11)
    weights = random_weights(models, seed=11)
    half = {k: {n: t.bfloat16() for n, t in m.items()} for k, m in models.items()}
    widened = {k: {n: t.float() for n, t in m.items()} for k, m in half.items()}
    new = laplacian_step(half, weights, step=0.03)
    exact = laplacian_step(widened, weights, step=0.03)
    for k in new:
        for name in new[k]:
            assert new[k][name].dtype == torch.bfloat16
            assert torch.equal(new[k][name], exact[k][name].bfloat16())


def test_models_of_one_step_must_share_tensor_names():
    models = {0: {"w": torch.zeros(2)}, 1: {"v": torch.zeros(2)}}
    with pytest.raises(ValueError, match="other tensors"):
        laplacian_step(models, {0: {1: 1.0}, 1: {0: 1.0}}, step=0.1)


def test_sfmtl_head_step_per_community_matches_the_loop_over_all_clients():
    """SFMTL-Graph's server: one product per community = the loop on the community weights."""
    clients, labels = list(range(9)), [0, 1, 0, 2, 1, 0, 2, 2, 1]
    generator = torch.Generator().manual_seed(13)
    similarity = torch.rand(9, 9, generator=generator)
    similarity = (similarity + similarity.T) / 2
    uploads = {
        i: {
            "head.fc.weight": torch.randn(3, 4, generator=generator),
            "head.fc.bias": torch.randn(3, generator=generator),
            "anchor": torch.randn(1, 4, generator=generator),
            "classes": torch.tensor([0], dtype=torch.int32),
        }
        for i in clients
    }
    result = {
        "clients": torch.tensor(clients, dtype=torch.int32),
        "community": torch.tensor(labels, dtype=torch.int32),
        "similarity": similarity,
    }
    params = SFMTLGraphParams(lr=0.1, epochs=2, lam=0.5)
    federation = FederationInfo(9, (1,) * 9, (2,) * 9, (1,) * 9)
    ctx = StepContext(
        me="server", round=1, rounds=1, seed=0, sampled=tuple(clients), federation=federation
    )
    state = State(extras={"uploads": uploads})
    inbox = [Message("graph", "server", "communities", result)]
    _, outbox = SFMTLGraph(params, model_factory=None).aggregate(state, inbox, ctx)
    heads = {i: {n: t for n, t in uploads[i].items() if n.startswith("head.")} for i in clients}
    weights = community_weights(clients, labels, similarity)
    old = reference_laplacian_step(heads, weights, step=0.1 * 2 * 0.5)
    replies = {m.dst: m.tensors for m in outbox}
    for i in clients:
        for name, value in old[i].items():
            assert torch.allclose(replies[f"client/{i}"][name], value, rtol=0, atol=1e-6)


@pytest.mark.parametrize("similarity", ["random", "ones", "given"])
@pytest.mark.parametrize("rows", [[7], [0, 3, 11, 12]])
# reached one by one (or spans only where contiguous) / spans and entries / whole matrix
@pytest.mark.parametrize("draws_per_entry", [1, 3, 10**9])
def test_similarity_rows_are_the_entries_of_the_full_matrix(
    similarity, rows, draws_per_entry, monkeypatch
):
    """dFedU's row or FedU's sample block: bit for bit the entries of similarity_matrix."""
    monkeypatch.setattr(fedu, "DRAWS_PER_ENTRY", draws_per_entry)
    n = 40
    given = np.random.default_rng(0).uniform(size=(n, n)).tolist()
    params = FedUParams(similarity=given if similarity == "given" else similarity, threshold=0.3)
    columns = [0, 1, 3, 7, 11, 12, 39]
    full = similarity_matrix(params, n, seed=4)
    expected = {k: {l_: float(full[k, l_]) for l_ in columns if l_ != k} for k in rows}
    assert similarity_rows(params, n, 4, rows, columns) == expected


def test_similarity_rows_of_a_cohort_of_a_large_federation_agree_by_both_routes(monkeypatch):
    """N = 100,000, a cohort of 300: row spans and one-by-one entries give the same values."""
    n, params = 100_000, FedUParams()
    cohort = sorted(np.random.default_rng(1).choice(n, size=300, replace=False).tolist())
    by_spans = similarity_rows(params, n, 2, cohort, cohort)
    monkeypatch.setattr(fedu, "DRAWS_PER_ENTRY", 1)
    one_by_one = similarity_rows(params, n, 2, cohort, cohort)
    assert by_spans == one_by_one
    assert all(by_spans[k][l_] == by_spans[l_][k] for k in cohort for l_ in cohort if l_ != k)
    values = [v for row in by_spans.values() for v in row.values()]
    assert 0.7 < sum(v > 0 for v in values) / len(values) < 0.8  # P(U ≥ 0.25) = 0.75
