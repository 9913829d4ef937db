"""char_lstm (raymtl/models/text.py): LEAF's next-character model for Shakespeare."""

from __future__ import annotations

import pytest
import torch
from torch.func import functional_call, stack_module_state, vmap

from raymtl.models import MODELS, build_model, num_params

SHAPE = (1, 1, 80)  # LEAF's Shakespeare: 80 characters predict the next one
VOCABULARY = 80


def ids(batch: int, length: int = 80, vocabulary: int = VOCABULARY, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocabulary, (batch, 1, 1, length), generator=generator).float()


def lstm_parameters(inputs: int, hidden: int) -> int:
    """One LSTM layer: W_ih (4h, in), W_hh (4h, h), b_ih and b_hh (4h each)."""
    return 4 * hidden * inputs + 4 * hidden * hidden + 2 * 4 * hidden


def test_registered_with_leaf_defaults() -> None:
    assert MODELS["char_lstm"].params == {
        "vocabulary": 80,
        "embedding": 8,
        "hidden": 256,
        "layers": 2,
    }
    assert MODELS["char_lstm"].inputs == ("tokens",)


def test_shapes_and_zeros() -> None:
    model = build_model("char_lstm", SHAPE, VOCABULARY)
    assert model.feature_dim == 256
    batch = ids(3)
    assert model(batch).shape == (3, VOCABULARY)
    assert model.features(batch).shape == (3, 256)
    assert model(torch.zeros(2, *SHAPE)).shape == (2, VOCABULARY)  # the planner's check
    assert build_model("char_lstm", (1, 1, 5), 7)(ids(2, 5)).shape == (2, 7)


def test_parameter_count_is_hand_computed() -> None:
    model = build_model("char_lstm", SHAPE, VOCABULARY)
    embedding = 80 * 8  # 640
    layer_1 = 4 * 256 * 8 + 4 * 256 * 256 + 8 * 256  # 272,384
    layer_2 = 4 * 256 * 256 + 4 * 256 * 256 + 8 * 256  # 526,336
    head = 256 * 80 + 80  # 20,560
    assert num_params(model) == embedding + layer_1 + layer_2 + head == 819_920
    small = build_model("char_lstm", SHAPE, 5, vocabulary=30, embedding=4, hidden=16, layers=3)
    expected = 30 * 4 + lstm_parameters(4, 16) + 2 * lstm_parameters(16, 16) + 16 * 5 + 5
    assert num_params(small) == expected


def test_state_dict_is_backbone_and_head() -> None:
    model = build_model("char_lstm", SHAPE, VOCABULARY)
    keys = list(model.state_dict())
    assert all(key.startswith(("backbone.", "head.")) for key in keys)
    assert "backbone.embedding.weight" in keys and "backbone.lstm.weight_hh_l1" in keys
    assert keys[-2:] == ["head.weight", "head.bias"]
    for prefix in model.common_prefixes():
        assert any(key.startswith(prefix + ".") for key in keys)


def test_training_on_a_repeated_text_lowers_the_loss() -> None:
    torch.manual_seed(0)
    text = "to be or not to be that is the question " * 2
    alphabet = sorted(set(text))
    codes = torch.tensor([alphabet.index(char) for char in text])
    length = 8
    starts = range(len(codes) - length)
    x = torch.stack([codes[s : s + length] for s in starts]).float().view(-1, 1, 1, length)
    y = torch.stack([codes[s + length] for s in starts])
    model = build_model(
        "char_lstm", (1, 1, length), len(alphabet), vocabulary=len(alphabet), hidden=32
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=0.03)
    losses = []
    for _ in range(25):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
    assert losses[-1] < 0.3 * losses[0], losses


@pytest.mark.parametrize(
    ("value", "shown"), [(80.0, "80"), (-1.0, "-1"), (2.5, "2.5"), (float("nan"), "nan")]
)
def test_values_that_are_no_character_ids_are_refused(value: float, shown: str) -> None:
    model = build_model("char_lstm", SHAPE, VOCABULARY)
    batch = ids(2)
    batch[1, 0, 0, 7] = value
    with pytest.raises(ValueError) as error:
        model(batch)
    message = str(error.value)
    assert message.startswith(f"char_lstm: input value {shown} (sample 1, position 7)")
    assert "model.params.vocabulary: 80" in message and "\n" not in message


def test_ids_off_by_float_noise_are_rounded() -> None:
    model = build_model("char_lstm", SHAPE, VOCABULARY)
    batch = ids(2)
    noisy = batch + 1e-4 * torch.randn(batch.shape).clamp(-1, 1)
    torch.testing.assert_close(model(noisy), model(batch), rtol=0, atol=0)


@pytest.mark.parametrize("param", ["vocabulary", "embedding", "hidden", "layers"])
def test_bad_params_are_one_line_errors(param: str) -> None:
    with pytest.raises(ValueError, match=f"model.params.{param}: 0 is not a positive integer"):
        build_model("char_lstm", SHAPE, VOCABULARY, **{param: 0})


def test_vmapped_and_meta_passes_equal_the_lstm() -> None:
    """Under torch.func (stacked evaluation, batched training) the recurrence is written
    out (nn.LSTM has no batching rule): the same outputs, and a meta pass runs."""
    torch.manual_seed(1)
    models = [build_model("char_lstm", (1, 1, 20), 6, vocabulary=30, hidden=24) for _ in "abc"]
    params, buffers = stack_module_state(models)
    params = {name: tensor.detach() for name, tensor in params.items()}
    xs = torch.stack([ids(5, 20, 30, seed=k) for k in range(3)])
    with torch.no_grad():
        stacked = vmap(lambda p, x: functional_call(models[0], p, (x,)))(params, xs)
        serial = torch.stack([model(x) for model, x in zip(models, xs, strict=True)])
    torch.testing.assert_close(stacked, serial, rtol=1e-4, atol=1e-5)
    meta = build_model("char_lstm", (1, 1, 20), 6, vocabulary=30, hidden=24).to("meta")
    assert meta(xs[0].to("meta")).shape == (5, 6)
