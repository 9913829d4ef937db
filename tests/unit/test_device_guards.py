"""Wrong-device bugs caught on a CPU-only machine: the code run with its tensors on "cuda".

Under torch's FakeTensorMode a tensor has a device, a dtype and a shape but no data, so
"cuda" tensors exist without a GPU and an op that mixes devices raises the error a real
GPU raises (index_add's "expected to be in the same device", "Expected all tensors to be on
the same device"). Each test builds its tensors on cuda as a GPU host holds them (a client's
model, data and kept state), with messages on the CPU where they come from Ray's object
store, and runs the code as a host runs it.

Limits. Fake tensors have no values: where code needs one (a finite check in an `if`,
`float()` of a loss for a record) torch raises its data-dependent error, and a test expects
exactly that error at the one documented point (`stops_for_a_value_in`) after everything
before it ran; the tensor maths after such a point is tested through the function it is
split into (`cross_entropy_means`, `batch_sums`, `weighted_sum`, `gram_matrix`, `combine`,
`similarity_matrices`). Backward needs a real device, so training steps (local SGD, pFedMe's
and FedMuscle's updates) stay on the GPU check (`make gpu-check`); their forward parts and
the in-place updates around them are tested here.
"""

from __future__ import annotations

import traceback
from pathlib import Path

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode, ShapeEnv

import raymtl
from raymtl.algorithms.aggregate import weighted_average, weighted_sum
from raymtl.algorithms.base import FederationInfo, Message, State, StepContext
from raymtl.algorithms.colnet import ColNet, ColNetParams, FedPerIC
from raymtl.algorithms.ditto import Ditto, DittoParams
from raymtl.algorithms.fedavg import FedAvg
from raymtl.algorithms.fedmuscle import FedMuscle, FedMuscleParams, PairwiseInfoNCE
from raymtl.algorithms.fedu import DFedU, FedUParams, laplacian_step
from raymtl.algorithms.hca import combine, conflict_averse_update, gram_matrix
from raymtl.algorithms.hierarchy import COMMON, common_of, lps_broadcast, pick
from raymtl.algorithms.ifca import initial_clusters, pack, unpack
from raymtl.algorithms.pfedme import PFedMe, PFedMeParams, local_copy_step, moreau_step
from raymtl.algorithms.sfmtl_graph import (
    SFMTLGraph,
    SFMTLGraphParams,
    anchor_loss,
    community_anchors,
)
from raymtl.algorithms.sheaf_fmtl import SheafFMTL, SheafFMTLParams
from raymtl.data.client_data import ClientData
from raymtl.graph.similarity import ClientView, shared_sums, similarity_matrices, stack_views
from raymtl.models.registry import build_model
from raymtl.tasks.objectives import (
    MetricAccumulator,
    batch_sums,
    cross_entropy_means,
    evaluate_stacked,
    evaluate_together,
    score_per_client,
)
from raymtl.tasks.spec import TaskSpec

RAYMTL = str(Path(raymtl.__file__).parent)
SHAPE = (1, 8, 8)


@pytest.fixture
def fake_cuda():
    """A FakeTensorMode for the test's body: tensors made with device="cuda" (or inside
    `on_cuda`) live on a GPU this machine does not have; others on the CPU."""
    shape_env = ShapeEnv(allow_dynamic_output_shape_ops=True, allow_scalar_outputs=True)
    with FakeTensorMode(allow_non_fake_inputs=True, shape_env=shape_env) as mode:
        yield mode


def on_cuda(build, *args, **kwargs):
    """`build(...)` with cuda as the default device: a module is built on the fake GPU
    (`Module.to("cuda")` of a module made under the mode cannot swap its parameters)."""
    with torch.device("cuda"):
        return build(*args, **kwargs)


def model_on_cuda(name: str = "mlp", classes: int = 3):
    return on_cuda(build_model, name, SHAPE, classes)


def assert_on_cuda(*tensors) -> None:
    for tensor in tensors:
        assert tensor.device.type == "cuda", tensor.device


def stops_for_a_value_in(point: str, run) -> None:
    """`run()` gets as far as raymtl's function `point`, where it needs a tensor's value,
    and stops there with torch's data-dependent error: nothing before it raised."""
    with pytest.raises(GuardOnDataDependentSymNode) as raised:
        run()
    frames = traceback.extract_tb(raised.value.__traceback__)
    # raymtl's own frames, without its comprehensions and generator expressions
    ours = [f.name for f in frames if f.filename.startswith(RAYMTL) and f.name[0] != "<"]
    assert ours and ours[-1] == point, ours


def context(me: str, clients: int = 3, **federation) -> StepContext:
    info = FederationInfo(clients, (4,) * clients, (3,) * clients, SHAPE, **federation)
    return StepContext(me, 1, 2, 0, tuple(range(clients)), info)


def client_data(samples: int = 6, classes: int = 3, public: int = 0) -> ClientData:
    """A client's data on cuda, as a GPU host moves it there (host_data.py)."""
    return ClientData(
        train_x=torch.randn(samples, *SHAPE, device="cuda"),
        train_y=torch.randint(0, classes, (samples,), device="cuda"),
        test_x=torch.randn(samples, *SHAPE, device="cuda"),
        test_y=torch.randint(0, classes, (samples,), device="cuda"),
        num_classes=classes,
        input_shape=SHAPE,
        public_x=torch.randn(public, *SHAPE, device="cuda") if public else None,
    )


def cpu_copy(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A message's tensors as Ray's object store hands them over: on the CPU."""
    return {name: t.detach().to("cpu") for name, t in tensors.items()}


# -- evaluation ---------------------------------------------------------------------------
def test_cross_entropy_sums_stay_on_the_outputs_device(fake_cuda):
    outputs = torch.randn(7, 4, device="cuda")
    targets = torch.randint(0, 4, (7,), device="cuda")
    losses, accuracies = cross_entropy_means(outputs, targets, [3, 0, 4])
    assert_on_cuda(losses, accuracies)
    assert losses.shape == accuracies.shape == (3,) and losses.dtype == torch.float64


@pytest.mark.parametrize("loss", ["cross_entropy", "bce", "mse"])
def test_metric_sums_stay_on_the_outputs_device(fake_cuda, loss):
    outputs = torch.randn(5, 3, device="cuda")
    if loss == "cross_entropy":
        targets = torch.randint(0, 3, (5,), device="cuda")
    else:
        targets = torch.rand(5, 3, device="cuda")
    sums = batch_sums(loss, outputs, targets)
    assert_on_cuda(*sums.values())
    task = None if loss == "cross_entropy" else TaskSpec(name="t", loss=loss)
    stops_for_a_value_in("add", lambda: MetricAccumulator(task).add(outputs, targets))


def test_scores_of_mixed_tasks_reach_the_float_conversion(fake_cuda):
    outputs = torch.randn(5, 3, device="cuda")
    tests = [
        (None, torch.randint(0, 3, (2,), device="cuda"), None),
        (None, torch.rand(3, 3, device="cuda"), TaskSpec(name="attributes", loss="bce")),
    ]
    stops_for_a_value_in("add", lambda: score_per_client(outputs, tests, [2, 3]))


@pytest.mark.parametrize("name", ["cnn_mnist", "mlp"])
def test_evaluate_together_on_cuda(fake_cuda, name):
    model = model_on_cuda(name).eval()
    sizes = [1, 130, 0]  # a padded last call; a client with no test sample
    tests = [
        (torch.randn(n, *SHAPE, device="cuda"), torch.randint(0, 3, (n,), device="cuda"), None)
        for n in sizes
    ]
    assert len(evaluate_together(model, tests)) == len(sizes)


@pytest.mark.parametrize("name", ["mlp", "cnn_mnist"])  # stacked and vmapped; one by one
def test_evaluate_stacked_on_cuda(fake_cuda, name):
    models = [model_on_cuda(name).eval() for _ in range(3)]
    weights = [dict(model.state_dict()) for model in models]
    sizes = [1, 3, 40]  # two stacked chunks (1 and 4 rows per call) and one alone
    tests = [
        (torch.randn(n, *SHAPE, device="cuda"), torch.randint(0, 3, (n,), device="cuda"), None)
        for n in sizes
    ]
    assert len(evaluate_stacked(models[0], weights, tests)) == len(sizes)


# -- aggregation ---------------------------------------------------------------------------
def test_weighted_sum_on_cuda_and_where_weighted_average_needs_values(fake_cuda):
    updates = [({"w": torch.randn(2, 3, device="cuda")}, float(n)) for n in (1, 3)]
    assert_on_cuda(weighted_sum(updates, 4.0)["w"])
    stops_for_a_value_in("is_finite", lambda: weighted_average(updates))


def fedavg_like(cls, params=None, name: str = "mlp"):
    params = params or cls.Params()
    return cls(params, lambda participant, classes: model_on_cuda(name, classes))


@pytest.mark.parametrize("cls", [FedAvg, PFedMe])
def test_a_server_on_cuda_merges_an_average_from_the_object_store(fake_cuda, cls):
    algorithm = fedavg_like(cls, PFedMeParams() if cls is PFedMe else None)
    state = algorithm.init_state("server", None, context("server").federation)
    average = cpu_copy(dict(state.model.state_dict()))
    algorithm.merge(state, average)  # pFedMe: (1 − β)·w_prev + β·average
    assert_on_cuda(*state.model.state_dict().values())


def test_hierarchy_picks_and_broadcasts_common_layers_on_cuda(fake_cuda):
    head, body = torch.randn(3, 4, device="cuda"), torch.randn(4, device="cuda")
    store = {"backbone.w": {((4,), COMMON): body}, "head.w": {((3, 4), 0): head}}
    assert_on_cuda(*common_of(store, ("backbone.",), "lps/0").values())
    keys = {"backbone.w": ((4,), COMMON), "head.w": ((3, 4), 0)}
    assert_on_cuda(*pick(store, keys).values())
    state = State(extras={"model": store})
    gps = [Message("server", "lps/0", "common", {"backbone.w": torch.randn(4)})]  # CPU
    (reply,) = lps_broadcast(state, gps, {0: keys}, "lps/0")
    assert reply.tensors["backbone.w"].device.type == "cpu"  # the GPS's average, as it came
    assert_on_cuda(reply.tensors["head.w"])


def test_ifca_cluster_models_on_cuda(fake_cuda):
    template = dict(model_on_cuda().state_dict())
    clusters = initial_clusters(template, 3, seed=0)  # CPU permutations of cuda tensors
    for model in unpack(pack(clusters)):
        assert_on_cuda(*model.values())


# Ditto deep-copies the model it evaluates; copying a fake tensor asks for its data pointer,
# which torch warns about under FakeTensorMode alone.
@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")
def test_ditto_evaluates_a_cuda_model_with_its_kept_personal_tensors(fake_cuda):
    algorithm = fedavg_like(Ditto, DittoParams())
    model = model_on_cuda()
    personal = cpu_copy(dict(model.state_dict()))  # kept tensors, restored on the CPU
    evaluated = algorithm.eval_model(State(model, client_data(), {"personal": personal}))
    assert_on_cuda(*evaluated.state_dict().values())


# -- regularisers and alignment: a client's state on cuda, its inbox on the CPU -------------
def test_pfedme_moreau_and_local_copy_steps_on_cuda(fake_cuda):
    personal, local = model_on_cuda(), model_on_cuda()
    moreau_step(personal, local, 0.01, 15.0)  # no gradient yet: zeros on the model's device
    local_copy_step(local, personal, 0.01, 15.0)
    assert_on_cuda(*personal.parameters(), *local.parameters())


def test_fedu_laplacian_step_on_cuda_stops_only_at_the_finite_check(fake_cuda):
    models = {k: {"w": torch.randn(4, 5, device="cuda")} for k in range(3)}
    weights = {k: {j: 0.5 for j in range(3) if j != k} for k in range(3)}
    # The mixing matrix, the stacked blocks and the outputs are made on the models' device;
    # mix_block then needs to know whether every model is finite.
    stops_for_a_value_in("mix_block", lambda: laplacian_step(models, weights, 0.1))


def test_dfedu_regularises_a_cuda_client_from_cpu_messages(fake_cuda):
    mixing = {0: {0: 0.5, 1: 0.5}, 1: {0: 0.5, 1: 0.5}}
    algorithm = DFedU(FedUParams(similarity="ones"), None)
    model = model_on_cuda()
    state = State(model, client_data(), {"sent": cpu_copy(dict(model.state_dict()))})
    inbox = [Message("client/1", "client/0", "model", cpu_copy(dict(model.state_dict())))]
    stops_for_a_value_in(
        "is_finite",
        lambda: algorithm.regularise(state, inbox, context("client/0", 2, mixing=mixing)),
    )


def sfmtl_state() -> tuple[SFMTLGraph, State, StepContext]:
    algorithm = SFMTLGraph(SFMTLGraphParams(), None)
    state = State(model_on_cuda("cnn_mnist"), client_data())
    state.extras["classes"] = [0, 2]  # set by `client_anchor` from the data (a value)
    return algorithm, state, context("client/0")


def test_sfmtl_anchor_is_made_on_the_models_device_and_takes_cpu_replies(fake_cuda):
    algorithm, state, ctx = sfmtl_state()
    stops_for_a_value_in("client_anchor", lambda: algorithm.client_anchor(state, ctx))
    assert_on_cuda(state.extras["anchor"])  # made and moved before the classes are read
    features = state.model.features(state.data.train_x)
    assert_on_cuda(anchor_loss(features, state.data.train_y, state.extras["anchor"]))
    reply = cpu_copy({name: t for name, t in state.model.state_dict().items() if "head" in name})
    reply["anchor"] = torch.randn(2, state.model.feature_dim)  # Ā_c rows from the server
    algorithm.receive(state, [Message("server", "client/0", "head_anchor", reply)], ctx)
    assert_on_cuda(state.extras["anchor"], *state.model.state_dict().values())


def test_sfmtl_community_anchors_on_cuda(fake_cuda):
    anchors = {
        i: {0: torch.randn(4, device="cuda"), 2: torch.randn(4, device="cuda")} for i in (0, 1)
    }
    means = community_anchors(anchors, {0: 0, 1: 0}, (3, 5))
    assert_on_cuda(means[0][0], means[0][2])


def test_fedmuscle_embeds_on_cuda_and_sends_cpu(fake_cuda):
    algorithm = FedMuscle(FedMuscleParams(dim=4, public_batch=2), None)
    model = model_on_cuda("cnn_mnist")
    # add_representation's branch as it leaves it on a GPU model (its `.to` of a module
    # made under the fake mode cannot swap parameters: built on cuda here instead)
    model.projection = on_cuda(torch.nn.Linear, model.feature_dim, 4)
    state = State(model, client_data(public=5))
    batch = {"indices": torch.tensor([1, 3])}  # from the server, on the CPU
    inbox = [Message("server", "client/0", "public_batch", batch)]
    _, (upload,) = algorithm.embed(state, inbox, context("client/0"))
    assert upload.tensors["z"].device.type == "cpu"  # to the object store
    assert upload.tensors["z"].shape == (2, 4)


@pytest.mark.parametrize("downlink", ["tuples", "partners"])
def test_fedmuscle_and_infonce_losses_on_cuda(fake_cuda, downlink):
    params = FedMuscleParams(dim=4, public_batch=3, partners=2, downlink=downlink)
    partners = torch.randn(2, 3, 4, device="cuda")
    targets = FedMuscle(params, None).targets(partners)  # the server's maths, here on cuda
    assert_on_cuda(*targets.values())
    z = torch.randn(3, 4, device="cuda")
    assert_on_cuda(FedMuscle(params, None).loss(z, targets))
    assert_on_cuda(PairwiseInfoNCE(params, None).loss(z, {"partners": partners}))


# -- graph steps, HCA, sheaf maps ------------------------------------------------------------
def cuda_views(count: int = 4, classes: int = 3, dim: int = 5) -> list[ClientView]:
    held = [(0, 1), (1, 2), (0, 2), (2,)]
    return [
        ClientView(
            weight=torch.randn(classes, dim, device="cuda"),
            bias=torch.randn(classes, device="cuda"),
            anchors={c: torch.randn(dim, device="cuda") for c in held[i % len(held)]},
        )
        for i in range(count)
    ]


def test_similarity_graph_maths_on_cuda(fake_cuda):
    views = cuda_views()
    stacked = stack_views(views)
    assert_on_cuda(stacked.weight, stacked.bias, stacked.anchors, stacked.mask)
    assert_on_cuda(*shared_sums(stacked, block_elements=7))  # several blocks per class
    s, fs, as_ = similarity_matrices(views, alpha=0.49)
    assert_on_cuda(s, fs, as_)
    assert s.shape == (4, 4)


def test_hca_gram_and_update_on_cuda(fake_cuda):
    deltas = torch.randn(3, 10, device="cuda")
    assert_on_cuda(gram_matrix(deltas), combine(deltas, np.full(3, 1 / 3)))
    stops_for_a_value_in("_gram", lambda: conflict_averse_update(deltas))


def colnet_leader_inbox(group_mean, start) -> list[Message]:
    return [
        Message("client/0", "leader/0", "group_backbone", group_mean),
        Message("client/0", "leader/0", "round_start", start),
    ]


@pytest.mark.parametrize("cls", [ColNet, FedPerIC])
def test_colnet_leader_on_cuda(fake_cuda, cls):
    algorithm = cls(ColNetParams(), None)
    ctx = context("leader/0", 2, tasks=(0, 1))
    group_mean = {"backbone.w": torch.randn(4, 3, device="cuda")}
    start = {"backbone.w": torch.randn(4, 3, device="cuda")}
    state, (delta, *_) = algorithm.cross_exchange(
        State(), colnet_leader_inbox(group_mean, start), ctx
    )
    assert_on_cuda(*delta.tensors.values())
    other = {"backbone.w": torch.randn(4, 3, device="cuda")}
    deltas = {0: delta.tensors, 1: other}
    if cls is ColNet:  # HCA needs the Gram matrix's values (its finite check)
        stops_for_a_value_in(
            "_gram", lambda: algorithm.cross_group_backbone(group_mean, deltas, ctx)
        )
    else:
        backbone, _ = algorithm.cross_group_backbone(group_mean, deltas, ctx)
        assert_on_cuda(*backbone.values())


def test_sheaf_map_products_for_a_cuda_model(fake_cuda):
    params = SheafFMTLParams(gamma=0.5, map_params=("head.",))
    algorithm = SheafFMTL(params, None)
    mixing = {0: {0: 0.5, 1: 0.5}, 1: {0: 0.5, 1: 0.5}}
    ctx = context("client/0", 2, mixing=mixing)
    state = State(model_on_cuda(), client_data())
    (announced,) = algorithm.announce_dim(state, [], ctx)[1]
    algorithm.init_maps(state, [Message("client/1", "client/0", "dim", announced.tensors)], ctx)
    theta = algorithm.flat_theta(state.model)  # θ as the CPU copy the maps multiply
    (sent,) = algorithm.projections(state, ctx, theta)
    assert sent.tensors["projection"].device.type == "cpu"  # a message: P_ij θ_i
    # The θ-step with the neighbour's value needs to know it is finite; without a value
    # it runs to the end, loading θ back into the model on cuda.
    reply = [Message("client/1", "client/0", "projection", cpu_copy(sent.tensors))]
    stops_for_a_value_in("disagreements", lambda: algorithm.theta_step(state, reply, ctx))
    algorithm.theta_step(state, [], ctx)
    assert_on_cuda(*state.model.state_dict().values())
