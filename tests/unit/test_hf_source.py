"""`data.name: hf` (raymtl/data/hf_source.py): a Hugging Face dataset read from disk,
Parquet or images, its clients as Flower Datasets' partitioners make them. No network: the
hub is offline, and the datasets' cache lies in the test's folder."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

datasets = pytest.importorskip("datasets")
partitioners = pytest.importorskip("flwr_datasets.partitioner")

from raymtl.data.natural import natural  # noqa: E402
from raymtl.data.source_registry import is_keyed, load_pool  # noqa: E402

ROWS, FEATURES, CLASSES, WRITERS = 60, 8, 4, 5
COLUMNS = [f"f{i}" for i in range(FEATURES)]
FLOWER = {
    "iid": (partitioners.IidPartitioner, {}),
    "dirichlet": (partitioners.DirichletPartitioner, {"alpha": 1.0, "min_partition_size": 5}),
    "pathological": (
        partitioners.PathologicalPartitioner,
        {"num_classes_per_partition": 2, "class_assignment_mode": "deterministic"},
    ),
    "shard": (partitioners.ShardPartitioner, {"num_shards_per_partition": 2}),
}


@pytest.fixture(autouse=True)
def _offline(monkeypatch, tmp_path) -> None:
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf_cache")


def table(rows: int = ROWS, seed: int = 0, writer=None) -> datasets.Dataset:
    """`rows` samples of 8 float features, a ClassLabel and a writer column (w0..w4)."""
    rng = np.random.default_rng(seed)
    columns = {name: rng.normal(size=rows).astype(np.float32) for name in COLUMNS}
    columns["label"] = [(i * 7 + seed) % CLASSES for i in range(rows)]
    columns["writer"] = [f"w{(i * 3 + seed) % WRITERS}" for i in range(rows)]
    features = {name: datasets.Value("float32") for name in COLUMNS}
    features["label"] = datasets.ClassLabel(names=["ant", "bee", "cat", "dog"])
    features["writer"] = writer or datasets.Value("string")
    if writer is not None and writer.dtype.startswith("int"):
        columns["writer"] = [int(name[1:]) for name in columns["writer"]]
    return datasets.Dataset.from_dict(columns, features=datasets.Features(features))


def vectors(dataset: datasets.Dataset) -> np.ndarray:
    return np.stack([np.asarray(dataset[name], dtype=np.float32) for name in COLUMNS], axis=1)


def saved(tmp_path, name: str, dataset) -> str:
    folder = tmp_path / name
    dataset.save_to_disk(str(folder))
    return str(folder)


def flower_rows(kind: str, dataset, num_clients: int, seed: int, **given) -> list[set[int]]:
    """Each partition's rows as Flower Datasets' own partitioner makes them."""
    factory, options = FLOWER[kind]
    arguments = {"num_partitions": num_clients, **options, **given}
    if kind != "iid":
        arguments |= {"partition_by": "label", "seed": seed}
    partitioner = factory(**arguments)
    partitioner.dataset = dataset.add_column("row", list(range(len(dataset))))
    return [set(partitioner.load_partition(k)["row"]) for k in range(num_clients)]


def error(**params) -> str:
    with pytest.raises(ValueError) as caught:
        load_pool("hf", None, False, 0, 3, **params)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_natural_partition_by_writer(tmp_path) -> None:
    dataset = table()
    path = saved(tmp_path, "natural", dataset)
    pool = load_pool(
        "hf",
        None,
        False,
        0,
        None,
        path=path,
        partitioner={"name": "natural", "partition_by": "writer"},
    )
    assert is_keyed("hf") and pool.inputs == "vectors" and pool.scale == 1.0
    assert pool.x.shape == (ROWS, 1, 1, FEATURES) and pool.x.dtype.is_floating_point
    assert pool.class_names == ("ant", "bee", "cat", "dog") and pool.num_classes == CLASSES
    assert pool.keys.names == tuple(f"w{k}" for k in range(WRITERS))
    assert pool.keys.test is None and pool.test_start is None
    writers = np.asarray(dataset["writer"])
    x, labels = vectors(dataset), np.asarray(dataset["label"])
    for k, name in enumerate(pool.keys.names):
        own = np.flatnonzero(pool.keys.client == k)
        np.testing.assert_array_equal(own, np.flatnonzero(writers == name))
        np.testing.assert_array_equal(pool.x[own, 0, 0].numpy(), x[own])
        np.testing.assert_array_equal(pool.y[own].numpy(), labels[own])
    # The names are Flower's numbering of the writers.
    flower = partitioners.NaturalIdPartitioner(partition_by="writer")
    flower.dataset = dataset
    flower.load_partition(0)
    assert pool.keys.names == tuple(flower.partition_id_to_natural_id[k] for k in range(WRITERS))
    # The natural partition gives each client exactly its rows (split train/test).
    shards = natural(pool, WRITERS, seed=0, test_fraction=0.25)
    for k, shard in enumerate(shards):
        held = np.sort(np.concatenate([shard.train_idx, shard.test_idx]))
        np.testing.assert_array_equal(held, np.flatnonzero(writers == f"w{k}"))


@pytest.mark.parametrize("kind", sorted(FLOWER))
def test_flower_partitioners(tmp_path, kind: str) -> None:
    dataset = table()
    path = saved(tmp_path, kind, dataset)
    _, options = FLOWER[kind]
    pool = load_pool("hf", None, False, 7, 3, path=path, partitioner={"name": kind, **options})
    assert pool.keys.names == ("0", "1", "2")
    client = pool.keys.client
    assert client.shape == (ROWS,) and (client >= 0).all()  # every row, once
    np.testing.assert_array_equal(pool.x[:, 0, 0].numpy(), vectors(dataset))
    expected = flower_rows(kind, dataset, 3, seed=7)
    assert [set(np.flatnonzero(client == k).tolist()) for k in range(3)] == expected


@pytest.mark.filterwarnings("ignore:Classes")  # Flower's: some class goes to no partition
def test_rows_in_no_partition_are_dropped(tmp_path) -> None:
    dataset = table()
    path = saved(tmp_path, "dropped", dataset)
    random = {"num_classes_per_partition": 2, "class_assignment_mode": "random"}
    spec = {"name": "pathological", **random}
    pool = load_pool("hf", None, False, 7, 3, path=path, partitioner=spec)
    expected = flower_rows("pathological", dataset, 3, seed=7, **random)
    kept = np.array(sorted(set().union(*expected)))
    assert 0 < len(kept) < ROWS and len(pool.y) == len(kept)
    np.testing.assert_array_equal(pool.x[:, 0, 0].numpy(), vectors(dataset)[kept])
    np.testing.assert_array_equal(pool.y.numpy(), np.asarray(dataset["label"])[kept])
    assert [set(kept[pool.keys.client == k].tolist()) for k in range(3)] == expected


def test_default_partitioner_is_iid_over_twenty_clients(tmp_path) -> None:
    dataset = table()
    pool = load_pool("hf", None, False, 0, None, path=saved(tmp_path, "iid", dataset))
    assert len(pool.keys.names) == 20
    assert np.bincount(pool.keys.client).tolist() == [ROWS // 20] * 20


def test_given_test_split_is_marked(tmp_path) -> None:
    train, test = table(), table(rows=25, seed=1)
    path = saved(tmp_path, "splits", datasets.DatasetDict({"train": train, "test": test}))
    by_writer = {"name": "natural", "partition_by": "writer"}
    pool = load_pool(
        "hf", None, False, 0, None, path=path, test_split="test", partitioner=by_writer
    )
    assert len(pool.y) == ROWS + 25 and pool.test_start == ROWS
    np.testing.assert_array_equal(pool.keys.test, np.arange(ROWS + 25) >= ROWS)
    writers = np.asarray(list(train["writer"]) + list(test["writer"]))
    np.testing.assert_array_equal(np.asarray(pool.keys.names)[pool.keys.client], writers)
    np.testing.assert_array_equal(pool.x[ROWS:, 0, 0].numpy(), vectors(test))
    shards = natural(pool, WRITERS, seed=0)
    for k, shard in enumerate(shards):
        test_rows = np.flatnonzero(np.asarray(test["writer"]) == f"w{k}") + ROWS
        np.testing.assert_array_equal(shard.test_idx, test_rows)
    # Others: a second partitioner of the same kind and seed splits the test split.
    pool = load_pool("hf", None, False, 3, 3, path=path, test_split="test")
    assert np.bincount(pool.keys.client[pool.keys.test]).tolist() == [9, 8, 8]
    iid = [set(rows) for rows in flower_rows("iid", test, 3, seed=3)]
    tested = pool.keys.client[ROWS:]
    assert [set(np.flatnonzero(tested == k).tolist()) for k in range(3)] == iid


def test_parquet_reads_like_the_saved_folder(tmp_path) -> None:
    dataset = table()
    file = tmp_path / "data.parquet"
    dataset.to_parquet(str(file))
    pool = load_pool("hf", None, False, 0, 3, path=str(file))
    assert pool.class_names == ("ant", "bee", "cat", "dog")
    np.testing.assert_array_equal(pool.x[:, 0, 0].numpy(), vectors(dataset))
    np.testing.assert_array_equal(pool.y.numpy(), np.asarray(dataset["label"]))
    # Relative to data.root, like the other sources' paths.
    again = load_pool("hf", str(tmp_path), False, 0, 3, path="data.parquet")
    np.testing.assert_array_equal(again.keys.client, pool.keys.client)


def test_default_features_leave_out_label_and_partition_column(tmp_path) -> None:
    dataset = table(writer=datasets.Value("int64"))
    path = saved(tmp_path, "numeric_writer", dataset)
    by_writer = {"name": "natural", "partition_by": "writer"}
    pool = load_pool("hf", None, False, 0, None, path=path, partitioner=by_writer)
    assert pool.x.shape[-1] == FEATURES and pool.keys.names == tuple(map(str, range(WRITERS)))
    pool = load_pool("hf", None, False, 0, 3, path=path)  # iid: the writer is a feature
    assert pool.x.shape[-1] == FEATURES + 1
    pool = load_pool("hf", None, False, 0, 3, path=path, features=["f2", "f5"])
    np.testing.assert_array_equal(pool.x[:, 0, 0].numpy(), vectors(dataset)[:, [2, 5]])


def test_labels_without_class_label_are_their_sorted_values(tmp_path) -> None:
    dataset = table()
    dataset = dataset.add_column("kind", [str(10 * label + 5) for label in dataset["label"]])
    path = saved(tmp_path, "string_labels", dataset)
    pool = load_pool("hf", None, False, 0, 3, path=path, label_column="kind")
    assert pool.class_names == ("15", "25", "35", "5")  # sorted strings
    names = np.asarray(pool.class_names)[pool.y.numpy()]
    np.testing.assert_array_equal(names, np.asarray(dataset["kind"]))
    whole = dataset.add_column("score", [float(label) * 2 for label in dataset["label"]])
    pool = load_pool(
        "hf", None, False, 0, 3, path=saved(tmp_path, "floats", whole), label_column="score"
    )
    assert pool.class_names == ("0.0", "2.0", "4.0", "6.0")
    np.testing.assert_array_equal(pool.y.numpy(), np.asarray(dataset["label"]))


def picture_table(rows: int = 12):
    from PIL import Image

    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    images = [Image.new("RGB", (6, 5), colours[i % 3]) for i in range(rows)]
    features = datasets.Features(
        {"img": datasets.Image(), "label": datasets.ClassLabel(names=["r", "g", "b"])}
    )
    return datasets.Dataset.from_dict(
        {"img": images, "label": [i % 3 for i in range(rows)]}, features=features
    )


def test_image_column_is_decoded_and_resized(tmp_path) -> None:
    path = saved(tmp_path, "pictures", picture_table())
    pool = load_pool("hf", None, False, 0, 2, path=path, size=4)
    assert pool.inputs == "images" and pool.scale == 255.0
    assert pool.x.shape == (12, 3, 4, 4) and pool.x.dtype.is_floating_point is False
    assert pool.x[0, :, 0, 0].tolist() == [255, 0, 0] and pool.x[2, :, 3, 3].tolist() == [0, 0, 255]
    assert pool.class_names == ("r", "g", "b")
    grey = load_pool("hf", None, False, 0, 2, path=path, size=3, grey=True, image_column="img")
    assert grey.x.shape == (12, 1, 3, 3)


def test_image_folder(tmp_path) -> None:
    from PIL import Image

    for label, colour in (("cats", (200, 10, 10)), ("dogs", (10, 10, 200))):
        (tmp_path / "images" / label).mkdir(parents=True)
        for i in range(4):
            Image.new("RGB", (8, 8), colour).save(tmp_path / "images" / label / f"{i}.png")
    pool = load_pool("hf", None, False, 0, 2, path=str(tmp_path / "images"), size=4)
    assert pool.x.shape == (8, 3, 4, 4) and pool.class_names == ("cats", "dogs")
    assert sorted(pool.y.tolist()) == [0] * 4 + [1] * 4


def test_errors_are_one_line(tmp_path) -> None:
    path = saved(tmp_path, "errors", table())
    message = error(path=path, partitioner={"name": "random"})
    assert message.startswith("data.params.partitioner:")
    assert "iid, dirichlet, pathological, shard, natural" in message
    message = error(path=path, partitioner={"name": "dirichlet", "alpha": 1, "beta": 2})
    assert message.startswith("data.params.partitioner.beta:") and "min_partition_size" in message
    message = error(path=path, partitioner={"name": "dirichlet"})
    assert message.startswith("data.params.partitioner.alpha: required")
    message = error(path=path, partitioner={"name": "natural"})
    assert message.startswith("data.params.partitioner.partition_by: required")
    message = error(path=path, partitioner={"name": "natural", "partition_by": "author"})
    assert "no column 'author'" in message
    assert error(path=path, test_split="test").startswith("data.params.test_split:")
    assert error(path=path, label_column="y").startswith("data.params.label_column:")
    assert error(path=path, features=["writer"]).startswith("data.params.features:")
    assert error(path=str(tmp_path / "absent")).startswith("data.params.path:")
    assert error().startswith("data.params.path:")
    message = error(hub="nobody/no-such-dataset")
    assert message.startswith("data.params.hub: could not load 'nobody/no-such-dataset' (")
    message = error(path=path, partitioner={"name": "iid", "num_partitions": 61})
    assert message.startswith("data.params.partitioner: 61 partitions")


def test_test_split_client_without_training_samples(tmp_path) -> None:
    test = table(rows=10).map(
        lambda row, i: {"writer": "w9" if i == 3 else row["writer"]}, with_indices=True
    )
    path = saved(tmp_path, "stranger", datasets.DatasetDict({"train": table(), "test": test}))
    by_writer = {"name": "natural", "partition_by": "writer"}
    message = error(path=path, test_split="test", partitioner=by_writer)
    assert message.startswith("data.params.test_split: client 'w9'")


def test_empty_partition_names_the_client(tmp_path) -> None:
    path = saved(tmp_path, "empty", table())
    skewed = {"name": "dirichlet", "alpha": 0.01, "min_partition_size": 0, "num_partitions": 40}
    message = error(path=path, partitioner=skewed)
    assert message.startswith("data.params.partitioner: client '")
    assert "min_partition_size" in message and "fewer clients" in message


def test_nan_features_and_fractional_labels_are_refused(tmp_path) -> None:
    dataset = table()
    broken = dataset.map(lambda row, i: {"f3": np.nan if i == 4 else row["f3"]}, with_indices=True)
    message = error(path=saved(tmp_path, "nan", broken))
    assert "NaN or inf" in message and "sample 4" in message
    fractional = dataset.cast_column("label", datasets.Value("float32"))
    fractional = fractional.map(lambda row: {"label": row["label"] + 0.5})
    message = error(path=saved(tmp_path, "fractional", fractional))
    assert "not class ids" in message


def test_import_leaves_the_extra_unloaded() -> None:
    check = (
        "import raymtl, raymtl.data, sys; "
        "assert 'datasets' not in sys.modules and 'flwr_datasets' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", check], check=True, timeout=120)


def test_missing_extra_is_one_line(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "flwr_datasets.partitioner", None)
    message = error(path=str(tmp_path / "anything"))
    assert message == "data.name: 'hf' needs the optional extra: pip install 'raymtl[hf]'"
