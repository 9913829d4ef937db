"""FedU and dFedU — Laplacian-regularised federated multi-task learning (baselines).

Dinh et al., "A New Look and Convergence Rate of Federated Multi-Task Learning with
Laplacian Regularization", IEEE TNNLS 2022 (docs/ALGORITHMS.md §6 and §7).

Round t, every participating client k after R = E local epochs of SGD (lr η):
    w_k ← w_k − η·λ·R·Σ_{l∈N(k), l≠k} a_kl·(w_k − w_l)        (all k simultaneously)
FedU: on the server, N(k) = the sampled clients S_t; each k ∈ S_t gets its w_k back.
dFedU: peer to peer, N(k) = k's neighbours in the communication graph.
a_kl: `similarity: random` is the reference setting — a symmetric U(0,1) matrix drawn once
per seed, entries < 0.25 set to 0; `ones` gives a_kl = 1; or a given N×N matrix.

Matrix form (`laplacian_step`, also SFMTL-Graph's head step with a_kl = s_ij in a community):
rows w_k of W (one per model, each flattened), A = (a_kl) with a_kk = 0 and a_kl = 0 where
l sent no usable model, D = diag(A·1), L = D − A, s = η·λ·R:
    W ← W − s·L·W = M·W,   M = I − s·L:  M_kk = 1 − s·Σ_l a_kl,  M_kl = s·a_kl
One matrix product (torch.mm, BLAS) per block of columns of W replaces the loop over the
pairs (k, l), three model-sized elementwise passes per pair: the same S²·d multiply-adds,
but cache-blocked and vectorised instead of memory-bound. Only the rows being updated are
computed, reading only the models they weight (dFedU: one row, k and its neighbours).
Float32 results differ from the pairwise loop only by summation order
(tests/unit/test_laplacian_matrix.py bounds the gap).
"""

from __future__ import annotations

from typing import Literal

import numpy as np
import torch
from pydantic import Field

from raymtl.algorithms.aggregate import by_sender, is_finite
from raymtl.algorithms.base import (
    SERVER,
    Algorithm,
    LocalTrainingParams,
    Message,
    Phase,
    client_name,
    index_of,
)
from raymtl.algorithms.registry import register_algorithm
from raymtl.algorithms.training import (
    derive_seed,
    load_received,
    load_tensors,
    model_tensors,
    train_local_model,
)

Tensors = dict[str, torch.Tensor]


class FedUParams(LocalTrainingParams):
    epochs: int = Field(5, ge=1, description="local epochs per round (R)")
    lam: float = Field(0.03, ge=0, description="Laplacian regularisation strength λ")
    similarity: Literal["random", "ones"] | list[list[float]] = Field(
        "random",
        description="a_kl: 'random' (symmetric U(0,1), < threshold zeroed, seeded), "
        "'ones', or a given N×N matrix",
    )
    threshold: float = Field(0.25, ge=0, le=1, description="random a_kl below this are set to 0")


def random_similarity(num_clients: int, seed: int, threshold: float = 0.25) -> np.ndarray:
    """The reference a_kl: symmetric U(0,1), zero diagonal, entries < threshold set to 0."""
    rng = np.random.default_rng(derive_seed(seed, "fedu-similarity"))
    upper = np.triu(rng.uniform(0.0, 1.0, size=(num_clients, num_clients)), k=1)
    a = upper + upper.T
    a[a < threshold] = 0.0
    return a


def similarity_matrix(params: FedUParams, num_clients: int, seed: int) -> np.ndarray:
    """a_kl for this federation (N×N, symmetric)."""
    if params.similarity == "random":
        return random_similarity(num_clients, seed, params.threshold)
    if params.similarity == "ones":
        return np.ones((num_clients, num_clients)) - np.eye(num_clients)
    a = np.asarray(params.similarity, dtype=float)
    if a.shape != (num_clients, num_clients):
        raise ValueError(f"algorithm.params.similarity: expected {num_clients}×{num_clients}")
    return a


# Reaching one entry of the random a_kl by PCG64.advance costs about as much as drawing 250
# entries in one call: a row's entries are drawn as one span when the span is shorter than
# 250 per entry needed, else reached one by one; the whole N×N matrix is drawn only when
# that is cheaper still (`draws_needed` ≥ N²: every client of a small federation).
DRAWS_PER_ENTRY = 250


def similarity_rows(
    params: FedUParams, num_clients: int, seed: int, rows: list[int], columns: list[int]
) -> dict[int, dict[int, float]]:
    """{k: {l: a_kl}} for k in `rows`, l ≠ k in `columns`: entries of `similarity_matrix`.

    Never builds the N×N matrix when far fewer entries are needed (dFedU: one row per client
    and round; FedU: |S_t|² of a large N): `ones` needs none, and the random a_kl are read
    from their places in the seeded stream, bit for bit the same values.
    """
    row_ids, column_ids = np.asarray(rows, dtype=np.int64), np.asarray(columns, dtype=np.int64)
    needed = needed_rows(row_ids, column_ids) if params.similarity == "random" else {}
    if params.similarity == "ones":
        block = np.ones((len(rows), len(columns)))
    elif needed and draws_needed(needed) < num_clients**2:
        block = random_block(num_clients, seed, row_ids, column_ids, needed, params.threshold)
    else:
        block = similarity_matrix(params, num_clients, seed)[np.ix_(row_ids, column_ids)]
    out: dict[int, dict[int, float]] = {}
    for k, values in zip(rows, block.tolist(), strict=True):
        out[k] = dict(zip(columns, values, strict=True))
        out[k].pop(k, None)
    return out


def needed_rows(rows: np.ndarray, columns: np.ndarray) -> dict[int, np.ndarray]:
    """{i: the sorted j > i} of the upper-triangle entries (i, j) that rows × columns read:
    (k, l) for k in rows, l in columns, k ≠ l, is entry (min, max)."""
    row_set, column_set = set(rows.tolist()), set(columns.tolist())
    sorted_rows, sorted_columns = np.unique(rows), np.unique(columns)
    needed = {}
    for i in sorted(row_set | column_set):
        later = []
        if i in row_set:
            later.append(sorted_columns[np.searchsorted(sorted_columns, i, side="right") :])
        if i in column_set:
            later.append(sorted_rows[np.searchsorted(sorted_rows, i, side="right") :])
        wanted = np.unique(np.concatenate(later))
        if wanted.size:
            needed[i] = wanted
    return needed


def draws_needed(needed: dict[int, np.ndarray]) -> int:
    """What `random_block` costs, in draws: per row, its span or DRAWS_PER_ENTRY a value."""
    return sum(min(int(js[-1] - js[0]) + 1, DRAWS_PER_ENTRY * len(js)) for js in needed.values())


def random_block(
    num_clients: int,
    seed: int,
    rows: np.ndarray,
    columns: np.ndarray,
    needed: dict[int, np.ndarray],
    threshold: float,
) -> np.ndarray:
    """random_similarity's rows × columns block (a_kk = 0), without drawing the matrix.

    Entry (i, j), i < j, is draw i·N + j of the seeded PCG64 stream (uniform(0, 1) takes one
    64-bit draw per value, row-major), which PCG64.advance reaches in O(log) steps. Per row
    i, the columns j > i `needed` are drawn as one span [first, last] when it is short
    enough, else reached one by one; (i, j) and (j, i) are the same draw, made once, into a
    symmetric matrix over the clients involved that the block is cut from.
    """
    clients = np.union1d(rows, columns)
    place = {int(c): p for p, c in enumerate(clients.tolist())}
    upper = np.zeros((len(clients), len(clients)))
    generator = np.random.PCG64(derive_seed(seed, "fedu-similarity"))
    start = generator.state
    for i, js in needed.items():
        first, span = int(js[0]), int(js[-1] - js[0]) + 1
        if span <= DRAWS_PER_ENTRY * len(js):
            generator.state = start
            generator.advance(i * num_clients + first)
            values = np.random.Generator(generator).uniform(0.0, 1.0, size=span)[js - first]
        else:
            values = np.empty(len(js))
            for n, j in enumerate(js.tolist()):
                generator.state = start
                generator.advance(i * num_clients + j)
                values[n] = np.random.Generator(generator).uniform(0.0, 1.0)
        upper[place[i], np.searchsorted(clients, js)] = values
    full = upper + upper.T
    full[full < threshold] = 0.0
    return full[np.ix_(np.searchsorted(clients, rows), np.searchsorted(clients, columns))]


# Values per stacked block (columns × block width): 4 MiB of float32, reused from block to
# block with the product's. Blocks bound the temporary memory (a stacked copy of 100
# cnn_mnist models would be another 660 MB, and one product as large again) and stay in
# cache between stacking, product and copy-out (at 100 cnn_mnist clients, about half the
# CPU time of one product over the whole models); each entry is the same sum over the same
# columns whatever the width.
BLOCK_VALUES = 1 << 20


def laplacian_step(
    models: dict[int, Tensors], weights: dict[int, dict[int, float]], step: float
) -> dict[int, Tensors]:
    """w_k − step·Σ_l a_kl·(w_k − w_l) for every k of `weights`, all from the models as given.

    Simultaneous, not sequential: every update reads the models passed in, never one already
    updated. Neighbours missing from `models` (dropped, non-finite), k itself and zero
    weights are skipped: such a model is never read by that row, so a NaN in it does not
    spread there. Only the rows of `weights` are computed (dFedU passes its own row only).
    """
    rows = sorted(weights)
    used = {
        k: {l_: a for l_, a in sorted(weights[k].items()) if l_ != k and a != 0 and l_ in models}
        for k in rows
    }
    columns = sorted(set(rows).union(*used.values()))
    mixing = mixing_matrix(rows, columns, used, step)
    return mix_models(models, rows, columns, mixing)


def mixing_matrix(
    rows: list[int], columns: list[int], used: dict[int, dict[int, float]], step: float
) -> np.ndarray:
    """M = I − step·L restricted to `rows` × `columns` (float64), L = D − A.

    M_kl = step·a_kl, M_kk = 1 − step·Σ_l a_kl: row k of M·W is w_k − step·Σ_l a_kl·(w_k − w_l).
    """
    position = {l_: c for c, l_ in enumerate(columns)}
    mixing = np.zeros((len(rows), len(columns)))
    for r, k in enumerate(rows):
        for l_, a in used[k].items():
            mixing[r, position[l_]] = step * a
        mixing[r, position[k]] = 1.0 - step * sum(used[k].values())
    return mixing


def mix_models(
    models: dict[int, Tensors], rows: list[int], columns: list[int], mixing: np.ndarray
) -> dict[int, Tensors]:
    """{k: Σ_l M_kl·w_l} for k in `rows`, l in `columns`: one matrix product per block.

    Per tensor name, the column models are stacked a block of entries at a time into a
    |columns| × width matrix X and the new rows are M·X (torch.mm: BLAS, intra-op threads).
    The tensor names are those of the first row's model; every model read must have them.
    """
    names = list(models[rows[0]]) if rows else []
    for k in rows[1:]:
        if set(models[k]) != set(names):
            raise ValueError(f"laplacian_step: model {k} has other tensors than model {rows[0]}")
    position = {l_: c for c, l_ in enumerate(columns)}
    own = [position[k] for k in rows]
    updated: dict[int, Tensors] = {k: {} for k in rows}
    for name in names:
        like = models[rows[0]][name]
        # float32 or float64 as given; half precision is mixed in float32 and rounded back
        # once (the loop rounded after every neighbour).
        dtype = like.dtype if like.dtype in (torch.float32, torch.float64) else torch.float32
        matrix = torch.from_numpy(mixing).to(like.device, dtype)
        flats = [models[l_][name].reshape(-1) for l_ in columns]
        outs = [torch.empty(like.shape, dtype=like.dtype, device=like.device) for _ in rows]
        out_flats = [out.view(-1) for out in outs]
        size = like.numel()
        width = max(1, min(size, max(1024, BLOCK_VALUES // len(columns))))
        stacked = torch.empty(len(columns), width, dtype=dtype, device=like.device)
        product = torch.empty(len(rows), width, dtype=dtype, device=like.device)
        for start in range(0, size, width):
            stop = min(start + width, size)
            block, mixed = stacked[:, : stop - start], product[:, : stop - start]
            for c, flat in enumerate(flats):
                block[c].copy_(flat[start:stop])
            mix_block(matrix, block, own, out=mixed)
            for r, out_flat in enumerate(out_flats):
                out_flat[start:stop].copy_(mixed[r])
        for k, out in zip(rows, outs, strict=True):
            updated[k][name] = out
    return updated


def mix_block(matrix: torch.Tensor, block: torch.Tensor, own: list[int], out: torch.Tensor) -> None:
    """out = matrix @ block, where a non-finite row of `block` reaches only the rows reading it.

    In a plain product a model weighted 0 still enters as 0·w_l, and 0·inf = NaN; the rows
    that weight it (or are its own update) get its non-finite values, as the loop gave them.
    `own[r]`: the row of `block` holding row r's own model.
    """
    finite = torch.isfinite(block.sum(dim=1))  # one NaN/inf anywhere makes the sum non-finite
    if bool(finite.all()):
        torch.mm(matrix, block, out=out)
        return
    bad = (~finite).nonzero().flatten().tolist()
    clean = block.clone()
    clean[bad] = 0
    torch.mm(matrix, clean, out=out)
    for c in bad:
        readers = [r for r in range(len(own)) if own[r] == c or float(matrix[r, c]) != 0]
        out[readers] += matrix[readers, c : c + 1] * block[c]


@register_algorithm
class FedU(Algorithm):
    name = "fedu"
    combines_otherwise = "a Laplacian step over the clients' similarity weights"
    summary = "FedU: local SGD, then a Laplacian step among sampled clients on the server"
    Params = FedUParams
    shapes = ("star",)

    def phases(self, round_index, rounds):
        return [
            Phase("client", "train", "sampled", trains=True),
            Phase("server", "regularise", "inbox"),
            Phase("client", "receive", "inbox"),
        ]

    def train(self, state, inbox, ctx):
        train_local_model(state, ctx, self.params)
        return state, [Message(ctx.me, SERVER, "model", model_tensors(state.model))]

    def regularise(self, state, inbox, ctx):
        models = {index_of(m.src): m.tensors for m in by_sender(inbox) if is_finite(m.tensors)}
        clients = sorted(models)
        weights = similarity_rows(
            self.params, ctx.federation.num_clients, ctx.seed, clients, clients
        )
        step = self.params.lr * self.params.lam * self.params.epochs
        updated = laplacian_step(models, weights, step)
        return state, [Message(SERVER, client_name(k), "model", w) for k, w in updated.items()]

    def receive(self, state, inbox, ctx):
        load_received(state.model, inbox)
        return state, []


@register_algorithm
class DFedU(Algorithm):
    name = "dfedu"
    combines_otherwise = "a Laplacian step over the peer graph's weights"
    summary = "dFedU: local SGD, then a Laplacian step with graph neighbours (peer to peer)"
    Params = FedUParams
    shapes = ("peer",)

    def phases(self, round_index, rounds):
        return [Phase("client", "train", "all", trains=True), Phase("client", "regularise", "all")]

    def train(self, state, inbox, ctx):
        train_local_model(state, ctx, self.params)
        tensors = model_tensors(state.model)
        state.extras["sent"] = tensors
        neighbours = ctx.federation.neighbours(ctx.index)
        return state, [Message(ctx.me, client_name(j), "model", tensors) for j in neighbours]

    def regularise(self, state, inbox, ctx):
        k = ctx.index
        models = {k: state.extras.pop("sent")}
        models |= {index_of(m.src): m.tensors for m in by_sender(inbox) if is_finite(m.tensors)}
        # Row k only: a_kl for the neighbours heard from, never the N×N matrix.
        weights = similarity_rows(
            self.params, ctx.federation.num_clients, ctx.seed, [k], sorted(models)
        )
        step = self.params.lr * self.params.lam * self.params.epochs
        updated = laplacian_step(models, weights, step)[k]
        load_tensors(state.model, updated)
        return state, []
