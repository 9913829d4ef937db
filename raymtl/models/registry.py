"""The FedModel contract and the one place where model names map to model classes.

    @register_model
    class MLP(FedModel):
        name = "mlp"
        description = "one-line description for `raymtl list`"
        def __init__(self, input_shape, num_classes, hidden: int = 32): ...

The keyword parameters of ``__init__`` after ``input_shape`` and ``num_classes`` are the
model's tunable parameters (``model.params``); ``register_model`` records them (with their
defaults) in ``cls.params`` after checking the class against the contract (``check_contract``):
a FedModel subclass with a ``name``, built as ``cls(input_shape, num_classes, **params)``.
"""

from __future__ import annotations

import inspect
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from raymtl.registry import Registry, identity

MODELS: Registry[type[FedModel]] = Registry("model.name")

# Constructor arguments every model takes; everything after them is a model parameter.
_COMMON_ARGS = ("self", "input_shape", "num_classes")


class FedModel(nn.Module):
    """backbone -> features; head -> logits. ``forward(x) = head(backbone(x))``.

    Every parameter name (state_dict key) starts with ``backbone.`` or ``head.``, or with
    ``projection.`` once a representation branch is added. ``feature_dim`` is the size of the
    flattened backbone output, i.e. ``features(x).shape == (B, feature_dim)``.

    Optional representation branch (FedMuscle, docs/ALGORITHMS.md): ``add_representation(d)``
    adds ``projection = Linear(feature_dim, d)``; ``represent(x)`` is then the L2-normalised
    ``projection(features(x))``, shape (B, d). ``forward`` never uses it, and a model without
    it has exactly the ``backbone.``/``head.`` state_dict it always had.
    """

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    params: ClassVar[dict[str, object]] = {}
    # The kinds of samples it reads (Pool.inputs): token ids are not pixels or features.
    inputs: ClassVar[tuple[str, ...]] = ("images", "vectors")

    def __init__(self, backbone: nn.Module, head: nn.Module, feature_dim: int) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = head
        self.feature_dim = feature_dim
        # A plain attribute while None (no state_dict entry); a submodule once added.
        self.projection: nn.Linear | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.backbone(x))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """Backbone output flattened to (B, feature_dim)."""
        return self.backbone(x).flatten(1)

    def common_prefixes(self) -> tuple[str, ...]:
        """Parameter-name prefixes shared across tasks by default in hierarchical FL."""
        return ()

    def add_representation(self, dim: int) -> None:
        """Add (or replace) the branch ``projection = Linear(feature_dim, dim)``.

        It is drawn on the CPU, from torch's CPU generator as the caller left it, and then
        moved to the device and dtype of the model's parameters: a model on a GPU gets the
        projection the same model on the CPU gets (a GPU's generator is no checkpointed or
        seeded stream of raymtl's).
        """
        if not _is_positive_int(dim):
            raise ValueError(f"model.representation_dim: {dim!r} must be a positive integer")
        reference = next(self.parameters(), None)
        projection = nn.Linear(self.feature_dim, dim)
        if reference is not None:
            projection = projection.to(device=reference.device, dtype=reference.dtype)
        self.projection = projection

    def represent(self, x: torch.Tensor) -> torch.Tensor:
        """Unit-L2 representation ``normalize(projection(features(x)))``, shape (B, dim)."""
        return F.normalize(self._projection()(self.features(x)), dim=1)

    def representation_parameters(self) -> list[nn.Parameter]:
        """Everything ``represent`` depends on: the backbone's and the projection's parameters."""
        return [*self.backbone.parameters(), *self._projection().parameters()]

    def _projection(self) -> nn.Linear:
        if self.projection is None:
            model = self.name or type(self).__name__
            raise RuntimeError(
                f"{model} has no representation branch: call add_representation(dim) first"
            )
        return self.projection


def register_model(cls: type[FedModel]) -> type[FedModel]:
    """Class decorator: make `cls` available under `cls.name`, recording its parameters.

    Raises a one-line ValueError for a class that breaks the contract (`check_contract`) or a
    name another class holds; the same class again (its module imported twice) replaces it.

    Args:
        cls: a `FedModel` subclass with a `name` (`model.name`), built as
            `cls(input_shape, num_classes, **params)`.

    Returns:
        `cls` itself, registered, its `params` set to its keyword parameters' defaults.

    Raises:
        ValueError: one line naming `cls`: it breaks the contract, or another class holds
            its name.
    """
    check_contract(cls)
    refusal = MODELS.clash(cls.name, cls)
    if refusal is not None:
        raise ValueError(refusal)
    signature = inspect.signature(cls.__init__)
    cls.params = {
        arg: parameter.default
        for arg, parameter in signature.parameters.items()
        if arg not in _COMMON_ARGS
        and parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }
    return MODELS.add(cls.name, cls)


def check_contract(cls: object) -> None:
    """Raise a one-line ValueError naming `cls` and what breaks the FedModel contract."""
    if not (isinstance(cls, type) and issubclass(cls, FedModel)):
        raise ValueError(f"model {cls!r}: is not a subclass of raymtl's FedModel")
    where = f"model class {identity(cls)}"
    if not isinstance(cls.name, str) or not cls.name.strip():
        raise ValueError(f"{where}: declares no `name` (the string model.name uses)")
    if not isinstance(cls.description, str):
        raise ValueError(f"{where}: description must be a string (for `raymtl list`)")
    parameters = list(inspect.signature(cls.__init__).parameters.values())
    leading = [p.name for p in parameters[: len(_COMMON_ARGS)]]
    if leading != list(_COMMON_ARGS):
        raise ValueError(f"{where}: __init__ must take (self, input_shape, num_classes, **params)")
    for parameter in parameters[len(_COMMON_ARGS) :]:
        plain = parameter.kind not in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        )
        if plain and parameter.default is inspect.Parameter.empty:
            raise ValueError(
                f"{where}: parameter '{parameter.name}' needs a default (model.params may "
                "leave it out)"
            )


def check_model_params(name: str, params: dict) -> None:
    """`model.params` are parameters of model `name` (one-line ValueError otherwise)."""
    model_cls = MODELS[name]
    for param in params:
        if param not in model_cls.params:
            allowed = ", ".join(model_cls.params) or "none"
            raise ValueError(
                f"model.params.{param}: not a parameter of {name} (allowed: {allowed})"
            )


def build_model(
    name: str, input_shape: tuple[int, int, int], num_classes: int, **params: object
) -> FedModel:
    """Instantiate the model registered as `name` (one-line ValueError on bad input)."""
    model_cls = MODELS.lookup(name)
    check_model_params(name, params)
    return model_cls(check_input_shape(input_shape), check_num_classes(num_classes), **params)


def check_input_shape(input_shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """Validate (channels, height, width) and return it as a tuple of ints."""
    shape = tuple(input_shape)
    if len(shape) != 3 or not all(_is_positive_int(size) for size in shape):
        raise ValueError(f"input_shape: {input_shape!r} is not (channels, height, width) > 0")
    return shape  # type: ignore[return-value]


def check_num_classes(num_classes: int) -> int:
    """Validate the number of outputs of the head (a positive integer)."""
    if not _is_positive_int(num_classes):
        raise ValueError(f"num_classes: {num_classes!r} is not a positive integer")
    return num_classes


def check_min_side(name: str, input_shape: tuple[int, int, int], min_side: int) -> None:
    """Reject inputs too small for the model's pooling stages."""
    if min(input_shape[1:]) < min_side:
        raise ValueError(
            f"input_shape: {tuple(input_shape)} is too small for {name} "
            f"(height and width must be >= {min_side})"
        )


def flat_output_size(module: nn.Module, input_shape: tuple[int, int, int]) -> int:
    """Size of ``module(x).flatten(1)`` for one input of `input_shape` (dry run)."""
    was_training = module.training
    # Eval mode: BatchNorm would reject a batch of one 1x1 map and must not update its stats.
    module.eval()
    with torch.no_grad():
        size = module(torch.zeros(1, *input_shape)).flatten(1).shape[1]
    module.train(was_training)
    return int(size)


def num_params(model: nn.Module) -> int:
    """Total number of parameter entries (trainable or not; buffers excluded)."""
    return sum(parameter.numel() for parameter in model.parameters())


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
