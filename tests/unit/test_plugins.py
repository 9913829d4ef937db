"""Plugins: a module outside the package registers one of each kind of thing, an experiment
names it in `plugins:` (by path or by module name), and it runs inline; every way a plugin
can fail is one ConfigError line."""

from __future__ import annotations

import sys
import textwrap

import pytest

from raymtl import plugins
from raymtl.algorithms.registry import ALGORITHMS
from raymtl.config import ConfigError, parse_config
from raymtl.data import PARTITIONS, SOURCES
from raymtl.graph import TOPOLOGIES
from raymtl.models import MODELS
from raymtl.tasks import TARGETS
from tests.conftest import digits_experiment

# One plugin module: every registry, names suffixed so that each test registers its own.
PLUGIN = '''
"""A user's plugin: FedAvg with a typed param, a model, a dataset, a partition, a topology
and a target, all through the public raymtl.extend."""

import networkx as nx
import numpy as np
import torch
from pydantic import Field
from torch import nn

from raymtl.extend import (
    FedAvg,
    FedModel,
    LocalTrainingParams,
    Pool,
    Targets,
    register_algorithm,
    register_dataset,
    register_model,
    register_partition,
    register_target,
    register_topology,
)

S = "{suffix}"


class ShrinkParams(LocalTrainingParams):
    beta: float = Field(0.5, ge=0, le=1, description="kept for the test of bad params")


@register_algorithm
class ShrinkFedAvg(FedAvg):
    name = "shrink_fedavg" + S
    summary = "FedAvg with a typed beta (test plugin)"
    Params = ShrinkParams


@register_model
class TinyNet(FedModel):
    name = "tiny_net" + S
    description = "flatten, linear(width), ReLU; linear head (test plugin)"

    def __init__(self, input_shape, num_classes, width: int = 6):
        size = int(np.prod(input_shape))
        backbone = nn.Sequential(nn.Flatten(), nn.Linear(size, width), nn.ReLU())
        super().__init__(backbone, nn.Linear(width, num_classes), width)


@register_dataset("blobs" + S)
def load_blobs(root=None, download=False, seed=0, num_samples: int = 240) -> Pool:
    """Four seeded Gaussian blobs as 1x4x4 images (test plugin)."""
    rng = np.random.default_rng(seed)
    y = np.arange(num_samples) % 4
    x = rng.normal(size=(num_samples, 1, 4, 4)) * 0.3 + y[:, None, None, None]
    x = (x - x.min()) / (x.max() - x.min())
    names = ("a", "b", "c", "d")
    return Pool(torch.tensor(x, dtype=torch.float32), torch.tensor(y), 4, names, 1.0, "blobs")


@register_partition("pairs" + S)
def pairs(class_counts, num_clients, rng, *, shift: int = 1):
    """Client i holds classes i and i + shift (test plugin)."""
    affinity = np.zeros((class_counts.size, num_clients))
    for client in range(num_clients):
        affinity[[client % class_counts.size, (client + shift) % class_counts.size], client] = 1
    return affinity


@register_topology("line" + S)
def line(num_nodes, seed, *, closed: bool = False):
    """Clients on a line (a ring when closed) (test plugin)."""
    return nx.cycle_graph(num_nodes) if closed and num_nodes > 2 else nx.path_graph(num_nodes)


@register_target("brightness" + S, loss="mse", metrics=("mse", "mae"))
def brightness(pool):
    """Mean intensity of each image (test plugin)."""
    values = pool.x.float().mean(dim=(1, 2, 3)).unsqueeze(1) / pool.scale
    return Targets(values, ("brightness",))
'''


@pytest.fixture(autouse=True)
def registries_restored(tmp_path_factory):
    """Each test's plugin leaves no trace in the registries or the plugin loader."""
    registries = (ALGORITHMS, MODELS, SOURCES, PARTITIONS, TOPOLOGIES, TARGETS)
    saved = [dict(registry) for registry in registries]
    loaders = (plugins._LOADED, plugins._ENTRY_OF_MODULE)
    saved_loaders = [dict(loader) for loader in loaders]
    found_in, path, modules = list(plugins._FOUND_IN), list(sys.path), set(sys.modules)
    yield
    for registry, before in zip(registries + loaders, saved + saved_loaders, strict=True):
        registry.clear()
        registry.update(before)
    plugins._FOUND_IN[:] = found_in
    sys.path[:] = path
    temporary = str(tmp_path_factory.getbasetemp())
    for name in set(sys.modules) - modules:
        if (getattr(sys.modules[name], "__file__", None) or "").startswith(temporary):
            del sys.modules[name]  # the plugins the tests wrote


def write_plugin(folder, stem: str, suffix: str, source: str = PLUGIN):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{stem}.py"
    path.write_text(textwrap.dedent(source).replace("{suffix}", suffix))
    return path


def plugin_experiment(tmp_path, plugin: str, suffix: str, **overrides) -> dict:
    raw = digits_experiment(
        tmp_path,
        **{
            "data.name": f"blobs{suffix}",
            "data.params": {"num_samples": 240},
            "data.partition": {"kind": f"pairs{suffix}", "params": {"shift": 2}},
            "data.tasks": [{"name": "bright", "targets": f"brightness{suffix}"}],
            "model.name": f"tiny_net{suffix}",
            "model.params": {"width": 5},
            "algorithm.name": f"shrink_fedavg{suffix}",
            "algorithm.params": {"epochs": 1, "lr": 0.1, "beta": 0.25},
            **overrides,
        },
    )
    return {"plugins": [plugin], **raw}


def rejected(raw: dict) -> str:
    with pytest.raises(ConfigError) as error:
        parse_config(raw)
    message = str(error.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_a_module_outside_sys_path_is_found_through_search_paths(tmp_path):
    folder = tmp_path / "elsewhere"
    write_plugin(folder, "user_plugin_s", "_s")
    with pytest.raises(ConfigError, match="could not be imported: ModuleNotFoundError"):
        plugins.load_plugins(["user_plugin_s"])
    plugins.load_plugins(["user_plugin_s"], search_paths=[str(folder)])
    assert "shrink_fedavg_s" in ALGORITHMS and "blobs_s" in SOURCES
    plugins.load_plugins(["user_plugin_s"], search_paths=[str(folder)])  # once per process
    assert sys.modules["user_plugin_s"].S == "_s"


def test_a_file_is_its_own_module_unless_its_name_is_taken(tmp_path):
    import importlib
    import json

    own = write_plugin(tmp_path / "a", "own_plugin_module", "", "VALUE = 1\n")
    plugins.load_plugins([str(own)])
    # Importing it by name elsewhere finds the same module, not a second copy.
    assert importlib.import_module("own_plugin_module").__file__ == str(own)
    taken = write_plugin(tmp_path / "b", "json", "", "VALUE = 2\n")
    plugins.load_plugins([str(taken)])
    assert not hasattr(json, "VALUE") and importlib.import_module("json") is json
    (renamed,) = [name for name in sys.modules if name.startswith("raymtl_plugin_json_")]
    assert sys.modules[renamed].VALUE == 2
    assert plugins.plugin_of(renamed) == "json.py" and plugins.plugin_of("raymtl.data") is None


def test_a_missing_module_is_one_line(tmp_path):
    raw = {"plugins": ["no_such_plugin_module"], **digits_experiment(tmp_path)}
    assert rejected(raw) == (
        "plugins: 'no_such_plugin_module' could not be imported: "
        "ModuleNotFoundError: No module named 'no_such_plugin_module'"
    )


def test_a_missing_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    raw = {"plugins": ["nowhere/my_plugin.py"], **digits_experiment(tmp_path)}
    assert rejected(raw).startswith("plugins: 'nowhere/my_plugin.py' is not a file")


def test_a_module_that_raises_on_import_is_one_line(tmp_path):
    source = "raise RuntimeError('the plugin needs a GPU\\nand more lines')\n"
    path = write_plugin(tmp_path, "raising", "", source)
    raw = {"plugins": [str(path)], **digits_experiment(tmp_path)}
    assert rejected(raw) == (
        f"plugins: '{path}' could not be imported: RuntimeError: the plugin needs a GPU"
    )
    assert "raising" not in sys.modules


BROKEN = {
    "an algorithm without phases": (
        "from raymtl.extend import Algorithm, register_algorithm\n"
        "@register_algorithm\nclass Phaseless(Algorithm):\n    name = 'phaseless'\n",
        "algorithm class broken.Phaseless: does not define phases(round_index, rounds)",
    ),
    "an algorithm without a name": (
        "from raymtl.extend import FedAvg, register_algorithm\n"
        "@register_algorithm\nclass Nameless(FedAvg):\n    name = ''\n",
        "declares no `name`",
    ),
    "a model without a name": (
        "from torch import nn\nfrom raymtl.extend import FedModel, register_model\n"
        "@register_model\nclass Nameless(FedModel):\n"
        "    def __init__(self, input_shape, num_classes):\n"
        "        super().__init__(nn.Flatten(), nn.Identity(), 1)\n",
        "model class broken.Nameless: declares no `name`",
    ),
    "a dataset without root and download": (
        "from raymtl.extend import register_dataset\n"
        "@register_dataset('mine')\ndef load(path):\n    '''Mine.'''\n",
        "register_dataset('mine'): load must take root and download",
    ),
    "a partition without class_counts": (
        "from raymtl.extend import register_partition\n"
        "@register_partition('mine')\ndef mine(labels):\n    '''Mine.'''\n",
        "register_partition('mine'): mine must take (class_counts, num_clients, rng",
    ),
    "a topology named like a shape": (
        "from raymtl.extend import register_topology\n"
        "@register_topology('star')\ndef star(num_nodes, seed):\n    '''Mine.'''\n",
        "register_topology('star'): 'star' is a built-in shape",
    ),
    "a target with another loss's metrics": (
        "from raymtl.extend import register_target\n"
        "@register_target('mine', loss='mse', metrics=['accuracy'])\ndef mine(pool):\n"
        "    '''Mine.'''\n",
        "register_target('mine'): metrics of loss mse are some of mse, mae",
    ),
    "a second model under a taken name": (
        "from raymtl.extend import FedModel, register_model\n"
        "@register_model\nclass Other(FedModel):\n    name = 'cnn_mnist'\n"
        "    def __init__(self, input_shape, num_classes):\n        pass\n",
        "model.name: 'cnn_mnist' is registered twice",
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_plugin_that_breaks_a_contract_is_one_line(tmp_path, case):
    source, problem = BROKEN[case]
    path = write_plugin(tmp_path, "broken", "", source)
    message = rejected({"plugins": [str(path)], **digits_experiment(tmp_path)})
    assert message.startswith(f"plugins: '{path}': ") and problem in message, message


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (
            {"algorithm.params": {"beta": 5}},
            "algorithm.params.beta: Input should be less than or equal to 1",
        ),
        ({"model.params": {"depth": 3}}, "model.params.depth: not a parameter of tiny_net_b"),
        (
            {"data.params": {"noise": 1}},
            "data.params.noise: not a parameter of source 'blobs_b' (num_samples)",
        ),
        (
            {"data.partition": {"kind": "pairs_b", "params": {"width": 2}}},
            "data.partition.params.width: not a parameter of kind 'pairs_b' (allowed: shift)",
        ),
        (
            {"data.tasks": [{"name": "t", "targets": "brightness_b", "metrics": ["f1"]}]},
            "data.tasks.0.metrics: 'f1' is not one of mse, mae",
        ),
    ],
)
def test_bad_params_of_plugin_entries_are_one_line(tmp_path, overrides, expected):
    path = write_plugin(tmp_path, "bad_params", "_b")
    message = rejected(plugin_experiment(tmp_path, str(path), "_b", **overrides))
    assert message.startswith(expected), message
