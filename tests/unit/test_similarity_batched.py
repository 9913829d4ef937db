"""The batched SFMTL-Graph similarity graph against the pairwise reference (docs/ALGORITHMS.md §9).

`similarity_graph` (per-class float64 products) must equal `pairwise_similarity_graph` (the
spec's plain form: `pair_similarity` pair by pair, float32 cosines averaged in float64).
Tolerance, absolute on s, FS and AS: TOLERANCE = 1e-6. The reference's cosines are float32:
a head output is a d-term float32 dot product (relative error ~ √d·2⁻²⁴ ≈ 1.4e-6·‖·‖ at
d = 512, far less in practice: torch sums in several partial sums), and the cosine a K-term
one on top; the batched side's float64 error (~1e-15) is negligible. Measured: at most
3e-7 over 4,950 pairs of 512-wide views, so 1e-6 holds with margin while a wrong class,
anchor set or mean (errors of order 1e-2 and up) cannot pass.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raymtl.graph.similarity import (
    ClientView,
    pair_similarity,
    pairwise_similarity_graph,
    shared_sums,
    similarity_graph,
    stack_views,
)

TOLERANCE = 1e-6
ALPHA = 0.49


def view(weight, anchors, bias=None) -> ClientView:
    weight = torch.tensor(weight, dtype=torch.float32)
    bias = torch.zeros(weight.shape[0]) if bias is None else torch.tensor(bias)
    return ClientView(weight, bias, {c: torch.tensor(v, dtype=torch.float32) for c, v in anchors})


def random_views(
    count: int, num_classes: int, dim: int, seed: int, classes_per_client: int | None = None
) -> dict[int, ClientView]:
    """Clients with random heads and anchors; class sets random (1..C classes) or of a fixed size.

    Client indices are every third number, inserted in descending order: the sort by client
    index is exercised.
    """
    generator = torch.Generator().manual_seed(seed)
    views = {}
    for index in range(count):
        size = classes_per_client or int(
            torch.randint(1, num_classes + 1, (1,), generator=generator)
        )
        classes = torch.randperm(num_classes, generator=generator)[:size].tolist()
        views[3 * (count - index) + 1] = ClientView(
            weight=0.1 * torch.randn(num_classes, dim, generator=generator),
            bias=0.1 * torch.randn(num_classes, generator=generator),
            anchors={c: torch.randn(dim, generator=generator) for c in classes},
        )
    return views


def assert_graphs_equal(views: dict[int, ClientView]) -> None:
    new, old = similarity_graph(views, ALPHA), pairwise_similarity_graph(views, ALPHA)
    assert new.clients == old.clients
    for name in ("s", "fs", "as_"):
        got, want = getattr(new, name), getattr(old, name)
        assert got.shape == want.shape == (len(views), len(views))
        np.testing.assert_allclose(got, want, rtol=0, atol=TOLERANCE, err_msg=name)


def test_hand_computed_four_clients():
    a = view([[1, 0], [0, 1]], [(0, [1, 0]), (1, [0, 1])])
    b = view([[1, 0], [1, 1]], [(0, [1, 1])])
    c = view([[0, 1], [1, 0]], [(1, [0, 2])])
    d = view([[1, 0], [0, 1]], [(0, [-1, 0])])
    graph = similarity_graph({0: a, 1: b, 2: c, 3: d}, ALPHA)
    # a-b (class 0): A_a[0] = (1,0): (1,0) vs (1,1) -> 1/√2; A_b[0] = (1,1): (1,1) vs (1,2)
    # -> 3/√10; AS = cos((1,0), (1,1)) = 1/√2.
    fs_ab, as_ab = 0.5 * (1 / math.sqrt(2) + 3 / math.sqrt(10)), 1 / math.sqrt(2)
    # a-c (class 1): A_a[1] = (0,1): (0,1) vs (1,0) -> 0; A_c[1] = (0,2): (0,2) vs (2,0)
    # -> 0; AS = cos((0,1), (0,2)) = 1; s = 0.51.
    # a-d (class 0): FS = ½(cos((1,0),(1,0)) + cos((-1,0),(-1,0))) = 1, AS = -1: s clipped.
    # b-d (class 0): A_b[0] = (1,1): (1,2) vs (1,1) -> 3/√10; A_d[0] = (-1,0): (-1,-1) vs
    # (-1,0) -> 1/√2; AS = cos((1,1), (-1,0)) = -1/√2.
    fs_bd, as_bd = fs_ab, -1 / math.sqrt(2)
    # b-c and c-d share no class: 0.
    want_fs = np.array(
        [[0, fs_ab, 0, 1], [fs_ab, 0, 0, fs_bd], [0, 0, 0, 0], [1, fs_bd, 0, 0]], dtype=float
    )
    want_as = np.array(
        [[0, as_ab, 1, -1], [as_ab, 0, 0, as_bd], [1, 0, 0, 0], [-1, as_bd, 0, 0]], dtype=float
    )
    s_ab, s_bd = ALPHA * fs_ab + (1 - ALPHA) * as_ab, ALPHA * fs_bd + (1 - ALPHA) * as_bd
    assert s_bd == pytest.approx(0.0451, abs=1e-4)  # small but positive: not clipped
    want_s = np.array(
        [[0, s_ab, 0.51, 0], [s_ab, 0, 0, s_bd], [0.51, 0, 0, 0], [0, s_bd, 0, 0]], dtype=float
    )
    np.testing.assert_allclose(graph.fs, want_fs, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(graph.as_, want_as, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(graph.s, want_s, rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize(
    ("count", "num_classes", "dim", "classes_per_client", "seed"),
    [
        (12, 4, 8, None, 0),  # random class sets of 1..4: overlaps, some disjoint pairs
        (20, 10, 32, 2, 1),  # SFMTL's 2 classes of 10 per client: most pairs disjoint
        (15, 10, 16, 10, 2),  # every class everywhere
        (40, 10, 512, None, 3),  # cnn_mnist's head width
    ],
)
def test_batched_equals_pairwise_on_random_views(count, num_classes, dim, classes_per_client, seed):
    assert_graphs_equal(random_views(count, num_classes, dim, seed, classes_per_client))


def test_disjoint_class_sets_give_an_empty_graph():
    views = {i: view([[1, 0], [0, 1], [1, 1]], [(i, [1.0, 2.0])]) for i in range(3)}
    graph = similarity_graph(views, ALPHA)
    for matrix in (graph.s, graph.fs, graph.as_):
        assert np.array_equal(matrix, np.zeros((3, 3)))
    assert_graphs_equal(views)


def test_one_client_and_no_client():
    graph = similarity_graph({5: view([[1, 0], [0, 1]], [(0, [1, 0])])}, ALPHA)
    assert graph.clients == (5,)
    assert graph.s.shape == graph.fs.shape == graph.as_.shape == (1, 1)
    assert graph.s[0, 0] == graph.fs[0, 0] == graph.as_[0, 0] == 0
    empty = similarity_graph({}, ALPHA)
    assert empty.clients == () and empty.s.shape == (0, 0)


def test_zero_norm_anchors_have_cosine_zero_as_in_the_reference():
    """A zero anchor row (and, with a zero bias, zero logits) has cosine 0 (the eps clamp)."""
    views = random_views(8, 4, 6, seed=4)
    zero = ClientView(torch.randn(4, 6), torch.zeros(4), {0: torch.zeros(6), 1: torch.zeros(6)})
    tiny = ClientView(torch.randn(4, 6), torch.randn(4), {0: torch.full((6,), 1e-14)})
    views |= {100: zero, 101: tiny}
    assert_graphs_equal(views)
    graph = similarity_graph(views, ALPHA)
    # Every cosine with a zero anchor row is 0, so the zero client's AS row is exactly 0.
    row = graph.clients.index(100)
    assert np.all(graph.as_[row] == 0)
    # The pair (zero, tiny) shares class 0 only; h_zero(0) = 0 -> FS on that anchor is 0.
    _, fs, as_ = pair_similarity(zero, tiny, ALPHA)
    column = graph.clients.index(101)
    assert (graph.fs[row, column], graph.as_[row, column]) == (
        pytest.approx(fs, abs=TOLERANCE),
        pytest.approx(as_, abs=TOLERANCE),
    )


def test_blocks_of_rows_change_nothing():
    """Small logit blocks (one row at a time, then 7 elements) give the one-block sums."""
    stacked = stack_views(list(random_views(9, 5, 12, seed=5).values()))
    whole = shared_sums(stacked)
    for block_elements in (1, 7):
        for got, want in zip(shared_sums(stacked, block_elements), whole, strict=True):
            torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_graph_is_symmetric_with_zero_diagonal_and_s_nonnegative():
    graph = similarity_graph(random_views(16, 6, 10, seed=6), ALPHA)
    for matrix in (graph.s, graph.fs, graph.as_):
        np.testing.assert_allclose(matrix, matrix.T, rtol=0, atol=1e-12)
        assert np.all(np.diag(matrix) == 0)
    assert np.all(graph.s >= 0)
