"""Data already split by client, end to end: the natural partition is the same run as the
same arrays with an explicit assignment; LEAF's text task and Synthetic run inline and on
Ray to the same numbers; bad data is one line (exit 2) before any run folder exists."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pandas as pd
import pytest
import yaml
from typer.testing import CliRunner

from raymtl.cli import app
from raymtl.config import ConfigError, parse_config
from raymtl.data.text import ALL_LETTERS
from raymtl.runtime import run_experiment
from tests.conftest import digits_experiment

pytestmark = pytest.mark.ray

COLUMNS = ["seed", "round", "client", "loss", "accuracy", "samples", "test_samples"]

# A partition kind that deals the samples as listed: client_train[i] / client_test[i] is the
# client of x[i] / x_test[i]; what `natural` should do with the same file.
EXPLICIT = """
    import numpy as np
    from raymtl.extend import register_partition
    from raymtl.data.shards import make_shard

    @register_partition("fd_explicit", shards=True)
    def explicit(labels, num_classes, *, file: str = "", **options):
        '''Clients as listed per sample in an .npz (client, client_test).'''
        arrays = np.load(options["params"]["file"])
        train, test = arrays["client"], arrays["client_test"]
        num_clients = options["num_clients"]
        offset = len(train)
        return [
            make_shard(k, np.flatnonzero(train == k), offset + np.flatnonzero(test == k), [])
            for k in range(num_clients)
        ]
"""


def clients_of(run_dir) -> pd.DataFrame:
    frame = pd.read_parquet(run_dir / "clients.parquet")
    return frame.sort_values(COLUMNS[:3]).reset_index(drop=True)[COLUMNS]


def digits_by_writer(path, writers: int = 4):
    """sklearn's digits as an .npz keyed by a made-up writer, with a given test split."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x, y = bunch.images.astype(np.uint8)[:400], bunch.target[:400]
    client = np.random.default_rng(0).integers(0, writers, len(y))
    cut = 320
    np.savez(
        path,
        x=x[:cut],
        y=y[:cut],
        client=client[:cut],
        x_test=x[cut:],
        y_test=y[cut:],
        client_test=client[cut:],
    )
    return path


def test_natural_is_the_same_run_as_arrays_with_an_explicit_assignment(tmp_path):
    file = digits_by_writer(tmp_path / "writers.npz")
    plugin = tmp_path / "fd_explicit.py"
    plugin.write_text(textwrap.dedent(EXPLICIT))
    keyed = digits_experiment(tmp_path / "keyed")
    keyed["data"] = {**keyed["data"], "name": "table", "params": {"path": str(file)}}
    keyed["data"].pop("num_clients")
    keyed["data"]["partition"] = {}  # natural, all the data's clients: the defaults
    listed = digits_experiment(tmp_path / "listed")
    listed["plugins"] = [str(plugin)]
    listed["data"] = {
        **listed["data"],
        "name": "arrays",
        "num_clients": 4,
        "params": {"path": str(file)},
        "partition": {"kind": "fd_explicit", "params": {"file": str(file)}},
    }
    keyed_cfg, listed_cfg = parse_config(keyed), parse_config(listed)
    assert keyed_cfg.data.num_clients == 4 and keyed_cfg.data.partition.kind == "natural"
    a = run_experiment(keyed_cfg, tmp_path / "a")
    b = run_experiment(listed_cfg, tmp_path / "b")
    pd.testing.assert_frame_equal(clients_of(a), clients_of(b))  # bit for bit
    rounds = [pd.read_parquet(d / "rounds.parquet") for d in (a, b)]
    pd.testing.assert_series_equal(rounds[0]["mean_loss"], rounds[1]["mean_loss"])


def shakespeare_like(folder, speakers=("ROMEO", "JULIET"), windows=40):
    """LEAF Shakespeare's JSON: per speaker, 80-character windows and the next character."""
    rng = np.random.default_rng(1)
    for split, count in (("train", windows), ("test", windows // 4)):
        data = {}
        for s, speaker in enumerate(speakers):
            text = "".join(rng.choice(list(ALL_LETTERS[10 + s * 20 : 40 + s * 20]), 200))
            x = [text[i : i + 80] for i in range(count)]
            data[speaker] = {"x": x, "y": [text[i + 80] for i in range(count)]}
        payload = {
            "users": list(speakers),
            "num_samples": [count] * len(speakers),
            "user_data": data,
        }
        (folder / split).mkdir(parents=True, exist_ok=True)
        (folder / split / f"{split}.json").write_text(json.dumps(payload))
    return folder


def text_experiment(tmp_path, folder, **overrides) -> dict:
    raw = digits_experiment(tmp_path, **overrides)
    raw["data"] = {"name": "leaf", "params": {"path": str(folder)}}
    raw["model"] = {"name": "char_lstm", "params": {"hidden": 16, "layers": 2}}
    return raw


@pytest.mark.parametrize("source", ["leaf_text", "leaf_synthetic"])
def test_keyed_sources_run_inline_and_on_ray_to_the_same_numbers(ray_session, tmp_path, source):
    if source == "leaf_text":
        raw = text_experiment(tmp_path / "runs", shakespeare_like(tmp_path / "text"))
    else:
        raw = digits_experiment(tmp_path / "runs")
        raw["data"] = {
            "name": "leaf_synthetic",
            "num_clients": 5,
            "params": {"alpha": 0.5, "beta": 0.5, "max_samples": 80},
        }
        raw["model"] = {"name": "logreg"}
    inline = run_experiment(parse_config(raw), tmp_path / "inline")
    raw["runtime"]["executor"] = "ray"
    remote = run_experiment(parse_config(raw), tmp_path / "ray")
    frame = clients_of(inline)
    pd.testing.assert_frame_equal(frame, clients_of(remote))
    expected = 2 if source == "leaf_text" else 5
    assert frame["client"].nunique() == expected and frame["loss"].notna().all()


def leaf_with(folder, mutate) -> str:
    """A FEMNIST-like LEAF folder of 3 writers, changed by `mutate(payload)` (train split)."""
    rng = np.random.default_rng(0)
    users = ["f0", "f1", "f2"]
    data = {u: {"x": rng.random((6, 784)).tolist(), "y": [k % 3 for k in range(6)]} for u in users}
    payload = {"users": users, "num_samples": [6, 6, 6], "user_data": data}
    mutate(payload)
    (folder / "train").mkdir(parents=True)
    (folder / "train" / "data.json").write_text(json.dumps(payload))
    return str(folder)


def nan_feature(payload):
    payload["user_data"]["f1"]["x"][2][5] = float("nan")


def empty_client(payload):
    payload["user_data"]["f2"] = {"x": [], "y": []}
    payload["num_samples"][2] = 0


def short_labels(payload):
    payload["user_data"]["f0"]["y"] = payload["user_data"]["f0"]["y"][:4]


def unlisted_user(payload):
    payload["users"][1] = "f9"


BAD = {
    "nan": (nan_feature, "NaN"),
    "empty_client": (empty_client, "f2"),
    "x_y_lengths": (short_labels, "f0"),
    "client_mismatch": (unlisted_user, "f9"),
}


def table_with_fractional_labels(folder) -> str:
    file = folder / "regression.npz"
    np.savez(
        file, x=np.ones((20, 4), np.float32), y=np.linspace(0, 1, 20), client=np.arange(20) % 2
    )
    return str(file)


@pytest.mark.parametrize("case", [*sorted(BAD), "fractional_labels"])
def test_bad_data_is_one_line_with_no_run_folder(tmp_path, case):
    if case == "fractional_labels":
        name, path, needle = "table", table_with_fractional_labels(tmp_path), "y"
    else:
        mutate, needle = BAD[case]
        name, path = "leaf", leaf_with(tmp_path / "leaf", mutate)
    raw = digits_experiment(tmp_path / "runs")
    raw["data"] = {"name": name, "params": {"path": path}}
    raw["model"] = {"name": "mlp"}
    experiment = tmp_path / "experiment.yaml"
    experiment.write_text(yaml.safe_dump(raw))
    result = CliRunner().invoke(app, ["run", str(experiment)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: data.") and path in line and needle in line, line
    with pytest.raises(ConfigError) as refused:  # the Python API: the same line
        run_experiment(parse_config(raw), tmp_path / "api")
    assert str(refused.value) in line
    assert not (tmp_path / "runs").exists() and not (tmp_path / "api").exists()


def test_a_relative_path_is_the_experiment_files_neighbour(tmp_path, monkeypatch):
    folder = tmp_path / "project"
    folder.mkdir()
    digits_by_writer(folder / "writers.npz", writers=3)
    raw = digits_experiment(tmp_path / "runs", rounds=1)
    raw["data"] = {"name": "table", "params": {"path": "writers.npz"}}
    raw["model"] = {"name": "mlp"}
    (folder / "experiment.yaml").write_text(yaml.safe_dump(raw))
    monkeypatch.chdir(tmp_path)  # elsewhere
    result = CliRunner().invoke(app, ["run", str(folder / "experiment.yaml")])
    assert result.exit_code == 0, result.output
    missing = CliRunner().invoke(
        app, ["run", str(folder / "experiment.yaml"), "data.params.path=no.npz"]
    )
    assert missing.exit_code == 2
    assert str(tmp_path / "no.npz") in missing.stderr  # the path tried, from the shell's folder


def test_token_data_is_refused_by_image_models_and_transforms(tmp_path):
    folder = shakespeare_like(tmp_path / "text")
    raw = text_experiment(tmp_path / "runs", folder)
    raw["model"] = {"name": "cnn_mnist"}
    with pytest.raises(ConfigError, match="model.name: 'cnn_mnist' reads images/vectors, not"):
        run_experiment(parse_config(raw), tmp_path / "a")
    raw = text_experiment(tmp_path / "runs", folder, **{"data.partition.rotations": [0, 90]})
    raw["data"]["partition"] = {"rotations": [0, 90]}
    with pytest.raises(ConfigError, match="data.partition.rotations: rotates or masks images"):
        run_experiment(parse_config(raw), tmp_path / "b")


def test_a_hugging_face_dataset_runs_by_its_writers(tmp_path, monkeypatch):
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")
    from sklearn.datasets import load_digits

    bunch = load_digits()
    rows = 240
    dataset = datasets.Dataset.from_dict(
        {
            **{f"p{j}": bunch.data[:rows, j].tolist() for j in range(64)},
            "label": bunch.target[:rows].tolist(),
            "writer": [f"w{i % 5}" for i in range(rows)],
        }
    )
    dataset.save_to_disk(str(tmp_path / "digits_hf"))
    raw = digits_experiment(tmp_path / "runs", rounds=1)
    raw["data"] = {
        "name": "hf",
        "params": {
            "path": str(tmp_path / "digits_hf"),
            "partitioner": {"name": "natural", "partition_by": "writer"},
        },
    }
    raw["model"] = {"name": "mlp"}
    cfg = parse_config(raw)
    assert cfg.data.num_clients == 5  # the writers
    frame = clients_of(run_experiment(cfg, tmp_path / "run"))
    assert sorted(frame["client"].unique()) == [0, 1, 2, 3, 4]
    assert (
        frame.groupby("client")["samples"].first() + frame.groupby("client")["test_samples"].first()
    ).tolist() == [48] * 5
