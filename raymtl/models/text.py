"""Models of text: `char_lstm`, LEAF's next-character model for Shakespeare.

A sample is a sequence of character ids held as floats: a pool of tokens gives
(1, 1, L) samples, ids 0..vocabulary-1 (source_registry.INPUT_KINDS); the model reads a
sample's C·H·W values, in order, as its sequence.
"""

from __future__ import annotations

import torch
from torch import nn

from raymtl.models.registry import FedModel, check_input_shape, register_model

# How far from a whole number an id may be (float noise) before it is refused.
_ID_TOLERANCE = 1e-3


def _positive(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"model.params.{name}: {value!r} is not a positive integer")
    return value


def _transformed(x: torch.Tensor) -> bool:
    """`x` is a torch.func (vmap, grad) wrapper or lives on the meta device: its values
    cannot be read (no data-dependent control flow) and nn.LSTM has no batching rule."""
    return x.device.type == "meta" or torch._C._functorch.is_functorch_wrapped_tensor(x)


class CharEncoder(nn.Module):
    """Character ids (B, C, H, W) -> Embedding -> stacked LSTM -> the last step's output
    (B, hidden)."""

    def __init__(self, vocabulary: int, embedding: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.vocabulary = vocabulary
        self.embedding = nn.Embedding(vocabulary, embedding)
        self.lstm = nn.LSTM(embedding, hidden, num_layers=layers, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        values = x.flatten(1)
        ids = values.round()
        transformed = _transformed(values)
        if not transformed:
            self._check_ids(values, ids)
        embedded = self.embedding(ids.long())
        if transformed:  # vmap (stacked evaluation, batched training) or a meta pass
            return self._unrolled(embedded)
        output, _ = self.lstm(embedded)
        return output[:, -1]

    def _check_ids(self, values: torch.Tensor, ids: torch.Tensor) -> None:
        """A one-line ValueError unless every value is a whole number in 0..vocabulary-1
        (NaN included: it passes none of the comparisons)."""
        good = (ids >= 0) & (ids < self.vocabulary) & ((values - ids).abs() <= _ID_TOLERANCE)
        if bool(good.all()):
            return
        sample, position = (int(i) for i in (~good).nonzero()[0])
        value = float(values[sample, position])
        raise ValueError(
            f"char_lstm: input value {value:g} (sample {sample}, position {position}) is not "
            f"a character id 0..{self.vocabulary - 1} (model.params.vocabulary: "
            f"{self.vocabulary}); char_lstm reads sequences of character ids, data of tokens"
        )

    def _unrolled(self, embedded: torch.Tensor) -> torch.Tensor:
        """nn.LSTM's recurrence written out with its own weights (PyTorch's gate order
        i, f, g, o): the same function in plain tensor operations, which torch.func can
        batch and the meta device can run."""
        layer_input = embedded
        for layer in range(self.lstm.num_layers):
            w_ih = getattr(self.lstm, f"weight_ih_l{layer}")
            w_hh = getattr(self.lstm, f"weight_hh_l{layer}")
            bias = getattr(self.lstm, f"bias_ih_l{layer}") + getattr(self.lstm, f"bias_hh_l{layer}")
            projected = layer_input @ w_ih.T + bias  # (B, L, 4·hidden): every step's input part
            h = projected.new_zeros(projected.shape[0], self.lstm.hidden_size)
            c = torch.zeros_like(h)
            outputs = []
            for step in range(projected.shape[1]):
                gates = projected[:, step] + h @ w_hh.T
                i, f, g, o = gates.chunk(4, dim=1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outputs.append(h)
            layer_input = torch.stack(outputs, dim=1)
        return layer_input[:, -1]


@register_model
class CharLSTM(FedModel):
    """LEAF's Shakespeare model: Embedding(vocabulary, 8), a 2-layer LSTM of 256 units, the
    last step's output -> Linear(256, num_classes), the next character."""

    name = "char_lstm"
    inputs = ("tokens",)  # what it reads (source_registry.INPUT_KINDS): character ids, not pixels
    description = (
        "next-character model (LEAF Shakespeare): embedding 8, 2-layer LSTM 256, last step "
        "-> linear head; inputs are character ids"
    )

    def __init__(
        self,
        input_shape: tuple[int, int, int],
        num_classes: int,
        vocabulary: int = 80,
        embedding: int = 8,
        hidden: int = 256,
        layers: int = 2,
    ) -> None:
        check_input_shape(input_shape)
        backbone = CharEncoder(
            _positive("vocabulary", vocabulary),
            _positive("embedding", embedding),
            _positive("hidden", hidden),
            _positive("layers", layers),
        )
        super().__init__(backbone, nn.Linear(hidden, num_classes), hidden)

    def common_prefixes(self) -> tuple[str, ...]:
        return ("backbone.embedding", "backbone.lstm")
