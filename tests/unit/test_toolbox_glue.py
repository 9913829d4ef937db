"""Where the toolbox meets the algorithms and the hosts, without Ray: `combine` and
`server_update` read the step's toolbox, central DP's clipped noisy mean by hand, the uplink's
transform and decode, and the experiment's one-line refusals."""

from __future__ import annotations

import pytest
import torch

from raymtl.algorithms.aggregate import combine, server_update, weighted_average
from raymtl.algorithms.base import FederationInfo, Message, State, StepContext
from raymtl.config import ConfigError, parse_config
from raymtl.runtime.hosts.uplink import Uplink, reference_of
from raymtl.toolbox.server_optimizers import server_step
from raymtl.toolbox.settings import Toolbox
from tests.conftest import digits_experiment

FEDERATION = FederationInfo(
    num_clients=4, samples=(1, 2, 3, 4), num_classes=(10,) * 4, input_shape=(1, 8, 8)
)


def context(toolbox: Toolbox, me: str = "server", sampled=(0, 1)) -> StepContext:
    return StepContext(
        me=me, round=1, rounds=3, seed=0, sampled=sampled, federation=FEDERATION, toolbox=toolbox
    )


def models(*rows) -> list[tuple[dict, float]]:
    return [({"w": torch.tensor(row)}, float(k + 1)) for k, row in enumerate(rows)]


def test_the_default_combination_is_the_weighted_average_bit_for_bit():
    updates = [({"w": torch.randn(50)}, float(n)) for n in (3, 7, 11)]
    expected = weighted_average(updates)
    assert torch.equal(combine(updates, context(Toolbox()))["w"], expected["w"])
    assert torch.equal(combine(updates)["w"], expected["w"])  # no context: the default


def test_the_rule_comes_from_the_step_context():
    updates = models([1.0], [2.0], [4.0], [10.0])
    median = Toolbox.model_validate({"aggregation": {"rule": "median"}})
    assert combine(updates, context(median))["w"].tolist() == [3.0]  # (2 + 4) / 2
    uniform = Toolbox.model_validate({"aggregation": {"weights": "uniform"}})
    assert combine(updates, context(uniform))["w"].tolist() == [4.25]  # 17 / 4


def test_krum_below_its_cohort_keeps_the_model_and_says_why(caplog):
    krum = Toolbox.model_validate({"aggregation": {"rule": "krum", "f": 1}})
    assert combine(models([1.0], [2.0], [3.0], [4.0]), context(krum)) is None  # 4 < 2f + 3
    assert "keeps its model" in caplog.text and "2f + 3" in caplog.text


def test_central_dp_is_the_clipped_mean_over_the_cohort_by_hand():
    # w_t = 0; Δ_1 = [3, 4] (norm 5) clips to [0.6, 0.8], Δ_2 = [0.3, 0.4] (norm 0.5) stays;
    # σ = 0: (Σ clipped) / m_t = [0.9, 1.2] / 2
    private = Toolbox.model_validate({"privacy": {"clip": 1.0, "noise_multiplier": 0.0}})
    ctx, state = context(private), State()
    reference = {"w": torch.zeros(2)}
    combined = combine(models([3.0, 4.0], [0.3, 0.4]), ctx, state, reference=reference)
    assert combined["w"] == pytest.approx(torch.tensor([0.45, 0.6]))
    assert ctx.records == [
        ("step_metrics", {"participant": "server", "clip": 1.0, "clipped": 1, "updates": 2})
    ]


def test_central_dp_noise_is_seeded_and_scaled_by_the_clip():
    private = Toolbox.model_validate({"privacy": {"clip": 2.0, "noise_multiplier": 0.5}})
    reference = {"w": torch.zeros(200_000)}
    updates = [({"w": torch.zeros(200_000)}, 1.0)]
    first = combine(updates, context(private, sampled=(0,)), State(), reference=reference)
    again = combine(updates, context(private, sampled=(0,)), State(), reference=reference)
    assert torch.equal(first["w"], again["w"])  # derive_seed(seed, round, server, privacy)
    assert float(first["w"].std()) == pytest.approx(1.0, rel=0.01)  # σ·C / m = 0.5·2 / 1


def test_adaptive_clipping_moves_the_bound_kept_in_the_servers_state():
    settings = {"clip": 1.0, "noise_multiplier": 0.1, "clipping": "adaptive", "count_noise": 1}
    private = Toolbox.model_validate({"privacy": settings})
    state = State()
    combine(
        models([3.0, 4.0], [0.3, 0.4]), context(private), state, reference={"w": torch.zeros(2)}
    )
    assert state.extras["privacy"]["clip"] != 1.0


def test_the_server_optimiser_steps_on_the_pseudo_gradient():
    adam = Toolbox.model_validate({"server_optimizer": {"name": "fedadam", "lr": 0.1}})
    weights, combined = {"w": torch.tensor([1.0, 2.0])}, {"w": torch.tensor([1.5, 1.0])}
    state = State()
    stepped = server_update(state, weights, combined, context(adam))
    expected, kept = server_step(adam.server_optimizer, weights, combined, {})
    assert torch.equal(stepped["w"], expected["w"])
    assert state.extras["server_optimizer"]["steps"] == kept["steps"] == 1
    assert server_update(State(), weights, combined, context(Toolbox())) is combined


def uplink_message(tensors) -> Message:
    return Message("client/1", "server", "model", tensors)


def test_a_sign_flip_attacker_sends_w_minus_its_update():
    toolbox = Toolbox.model_validate({"attack": {"fraction": 0.5, "kind": "sign_flip"}})
    uplink = Uplink(toolbox, ("model",), frozenset({1}))
    reference = {"w": torch.tensor([1.0, 1.0])}
    sent, bits = uplink.transform(
        uplink_message({"w": torch.tensor([1.5, 0.0])}), reference, {}, 0, 1
    )
    assert bits is None and sent["w"].tolist() == [0.5, 2.0]  # w_t − Δ


def test_encoded_updates_decode_against_the_reference_and_keep_a_residual():
    codec = {"kind": "topk", "ratio": 0.5, "error_feedback": True}
    uplink = Uplink(
        Toolbox.model_validate({"compression": {"uplink": codec}}), ("model",), frozenset()
    )
    reference = {"w": torch.tensor([1.0, 1.0, 1.0, 1.0])}
    extras: dict = {}
    sent = {"w": torch.tensor([2.0, -2.0, 1.5, 1.0])}  # Δ = [1, -3, 0.5, 0]: keeps 1 and -3
    payload, bits = uplink.transform(uplink_message(sent), reference, extras, 0, 1)
    assert bits == 2 * (32 + 2)  # k·(32 + ⌈log₂ d⌉)
    assert uplink.decode(payload, reference)["w"].tolist() == [2.0, -2.0, 1.0, 1.0]
    assert extras["uplink_residual/model"]["w"].tolist() == [0.0, 0.0, 0.5, 0.0]


def test_the_reference_is_what_the_inbox_brought_else_the_model_before_the_step():
    received = Message("server", "client/1", "global_model", {"w": torch.ones(2)})
    reference, index = reference_of(["w"], [received], {"w": torch.zeros(2)})
    assert index == 0 and reference["w"].tolist() == [1.0, 1.0]
    reference, index = reference_of(["w"], [], {"w": torch.zeros(2)})
    assert index is None and reference["w"].tolist() == [0.0, 0.0]


REFUSED = {
    "colnet takes no rule": (
        {"algorithm.name": "colnet", "aggregation": {"rule": "median"}},
        "aggregation.rule: colnet does not take an aggregation rule (task leaders combine",
    ),
    "peer uplink": (
        {"algorithm.name": "dpsgd", "compression": {"uplink": {"kind": "sign"}}},
        "compression.uplink: dpsgd does not take uplink compression (",
    ),
    "krum's cohort": (
        {"aggregation": {"rule": "krum", "f": 2}},
        "aggregation.f: Krum needs m >= 2f + 3; the cohort is m = 6",
    ),
    "dp with a robust rule": (
        {"aggregation": {"rule": "median"}, "privacy": {"clip": 1.0, "noise_multiplier": 1}},
        "aggregation.rule: median with central DP has no sensitivity bound",
    ),
    "negative clip": ({"privacy": {"clip": -1.0}}, "privacy.clip: Input should be greater than 0"),
    "ratio outside (0, 1]": (
        {"compression": {"uplink": {"kind": "topk", "ratio": 1.5}}},
        "compression.uplink.ratio: Input should be less than or equal to 1",
    ),
    "ε already spent": (
        {"privacy": {"clip": 1.0, "noise_multiplier": 0.5, "delta": 1e-3, "target_epsilon": 1}},
        "privacy.target_epsilon: 2 rounds would spend ε = ",
    ),
    "adaptive needs 2σ_b > σ": (
        {"privacy": {"clip": 1.0, "noise_multiplier": 2.0, "clipping": "adaptive"}},
        "privacy.count_noise: adaptive clipping needs 2σ_b > σ",
    ),
    "unknown rule": ({"aggregation": {"rule": "mode"}}, "aggregation.rule: Input should be"),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_toolbox_settings_are_one_line_naming_the_field(tmp_path, case):
    overrides, start = REFUSED[case]
    with pytest.raises(ConfigError) as refused:
        parse_config(digits_experiment(tmp_path, **overrides))
    message = str(refused.value)
    assert message.startswith(start), message
    assert "\n" not in message


def test_local_sgd_runs_dp_sgd_inside_the_sample_level_scope():
    from raymtl.algorithms.base import LocalTrainingParams
    from raymtl.algorithms.training import local_sgd
    from raymtl.toolbox.sample_level import sample_level
    from raymtl.toolbox.settings import SampleLevelSettings

    x, y = torch.randn(10, 4), torch.randint(0, 3, (10,))
    params = LocalTrainingParams(epochs=2, batch_size=4, lr=0.1)
    settings = SampleLevelSettings(clip=0.5, noise_multiplier=1.0)

    def trained(private: bool) -> tuple[torch.Tensor, list]:
        torch.manual_seed(0)
        model = torch.nn.Linear(4, 3)
        with sample_level(settings if private else None) as taken:
            run = local_sgd(model, x, y, params, seed=3)
        assert run.steps == 6  # 2 epochs of ⌈10/4⌉ batches
        return model.weight.detach().clone(), taken

    plain, none = trained(False)
    private, taken = trained(True)
    again, _ = trained(True)
    assert none == [] and taken == [(6, 10, 4)]  # (steps, samples, batch size) for its ε
    assert torch.equal(private, again) and not torch.allclose(private, plain)
    model = torch.nn.Linear(4, 3)  # Opacus's hooks are gone: the model trains plainly again
    local_sgd(model, x, y, params, seed=3)
    assert not hasattr(model.weight, "grad_sample")
