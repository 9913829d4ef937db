"""Sources load from tiny files written in each dataset's real on-disk format."""

import gzip
import os
import pickle
import struct

import numpy as np
import pytest
import torch

from raymtl.data import SOURCES, DatasetMissing, load_pool
from raymtl.data import sources as sources_module

IDX_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
SPLIT_SIZES = {"train": 6, "test": 4}


def write_idx(path, array: np.ndarray, compress: bool) -> None:
    """The idx format: zero bytes, type 0x08 (uint8), ndim, big-endian dims, then the data."""
    header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    opener = gzip.open if compress else open
    with opener(f"{path}.gz" if compress else path, "wb") as handle:
        handle.write(header + array.astype(np.uint8).tobytes())


def write_idx_dataset(directory, compress: bool = False) -> None:
    os.makedirs(directory, exist_ok=True)
    for split, (image_name, label_name) in IDX_FILES.items():
        size = SPLIT_SIZES[split]
        images = np.arange(size * 28 * 28).reshape(size, 28, 28) % 256
        write_idx(os.path.join(directory, image_name), images, compress)
        write_idx(os.path.join(directory, label_name), np.arange(size) % 10, compress)


@pytest.fixture
def no_debian_fashion(monkeypatch, tmp_path):
    monkeypatch.setattr(sources_module, "DEBIAN_FASHION_MNIST_DIR", str(tmp_path / "absent"))


def test_registry_names():
    assert {"digits", "fashion_mnist", "mnist", "cifar10", "cifar100", "synthetic"} <= set(SOURCES)


def test_digits_loads_as_uint8_with_scale_16():
    pool = load_pool("digits")
    assert pool.x.shape == (1797, 1, 8, 8) and pool.x.dtype == torch.uint8
    assert pool.y.shape == (1797,) and pool.y.dtype == torch.int64
    assert (pool.num_classes, pool.scale, pool.source) == (10, 16.0, "sklearn")
    assert int(pool.x.max()) == 16
    assert load_pool("digits") is pool  # cached per process
    assert load_pool("digits", seed=7) is pool  # the seed only matters to random sources


def test_synthetic_is_deterministic_and_parametrised():
    pool = load_pool("synthetic", seed=3, num_samples=120, num_classes=4, shape=[3, 5, 5])
    again = SOURCES["synthetic"](seed=3, num_samples=120, num_classes=4, shape=(3, 5, 5))
    other = load_pool("synthetic", seed=4, num_samples=120, num_classes=4, shape=(3, 5, 5))
    assert pool.x.shape == (120, 3, 5, 5) and pool.x.dtype == torch.float32
    assert torch.equal(pool.x, again.x) and torch.equal(pool.y, again.y)
    assert not torch.equal(pool.x, other.x)
    assert float(pool.x.min()) == 0.0 and float(pool.x.max()) == 1.0
    assert torch.bincount(pool.y).tolist() == [30] * 4
    assert (pool.num_classes, pool.scale, pool.source) == (4, 1.0, "synthetic")


@pytest.mark.parametrize("compress", [False, True])
@pytest.mark.parametrize("layout", ["flat", "torchvision"])
def test_fashion_mnist_from_root(tmp_path, compress, layout):
    directory = tmp_path if layout == "flat" else tmp_path / "FashionMNIST" / "raw"
    write_idx_dataset(directory, compress)
    pool = load_pool("fashion_mnist", root=str(tmp_path))
    assert pool.x.shape == (10, 1, 28, 28) and pool.x.dtype == torch.uint8
    assert pool.y.tolist() == [0, 1, 2, 3, 4, 5, 0, 1, 2, 3]
    assert pool.class_names[0] == "T-shirt/top" and pool.num_classes == 10
    assert pool.source == str(directory) and pool.scale == 255.0


@pytest.mark.skipif(
    not os.path.isdir(sources_module.DEBIAN_FASHION_MNIST_DIR), reason="no Debian fashion-mnist"
)
def test_fashion_mnist_from_debian_package():
    pool = load_pool("fashion_mnist")
    assert pool.x.shape == (70000, 1, 28, 28) and pool.y.shape == (70000,)
    assert pool.source == sources_module.DEBIAN_FASHION_MNIST_DIR


def test_mnist_from_torchvision_raw_files(tmp_path):
    write_idx_dataset(tmp_path / "MNIST" / "raw")
    pool = load_pool("mnist", root=str(tmp_path))
    assert pool.x.shape == (10, 1, 28, 28) and pool.x.dtype == torch.uint8
    assert pool.y.dtype == torch.int64 and pool.num_classes == 10


def write_pickle(path, content) -> None:
    with open(path, "wb") as handle:
        pickle.dump(content, handle)


def cifar_batch(size, label_key, offset):
    data = (np.arange(size * 3072).reshape(size, 3072) + offset) % 256
    return {"data": data.astype(np.uint8), label_key: [i % 3 for i in range(size)]}


def test_cifar10_from_tiny_batches(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    folder.mkdir()
    for i in range(1, 6):
        write_pickle(folder / f"data_batch_{i}", cifar_batch(2, "labels", i))
    write_pickle(folder / "test_batch", cifar_batch(3, "labels", 0))
    write_pickle(folder / "batches.meta", {"label_names": [f"c{i}" for i in range(10)]})
    pool = load_pool("cifar10", root=str(tmp_path))
    assert pool.x.shape == (13, 3, 32, 32) and pool.x.dtype == torch.uint8
    first = torch.from_numpy(cifar_batch(2, "labels", 1)["data"][0].reshape(3, 32, 32))
    assert torch.equal(pool.x[0], first)  # CHW as stored, not HWC
    assert pool.num_classes == 10 and pool.class_names[9] == "c9"


def test_cifar100_from_tiny_files(tmp_path):
    folder = tmp_path / "cifar-100-python"
    folder.mkdir()
    write_pickle(folder / "train", cifar_batch(4, "fine_labels", 0))
    write_pickle(folder / "test", cifar_batch(2, "fine_labels", 1))
    write_pickle(folder / "meta", {"fine_label_names": [f"f{i}" for i in range(100)]})
    pool = load_pool("cifar100", root=str(tmp_path))
    assert pool.x.shape == (6, 3, 32, 32) and pool.y.tolist() == [0, 1, 2, 0, 0, 1]
    assert pool.num_classes == 100


@pytest.mark.parametrize("name", ["fashion_mnist", "mnist", "cifar10", "cifar100"])
def test_missing_dataset_says_how_to_get_it(tmp_path, no_debian_fashion, name):
    with pytest.raises(DatasetMissing, match="data.root") as error:
        load_pool(name, root=str(tmp_path / "empty"))
    assert "data.download=true" in str(error.value) and "\n" not in str(error.value)


def test_missing_fashion_mnist_mentions_the_debian_package(tmp_path, no_debian_fashion):
    with pytest.raises(DatasetMissing, match="apt-get install dataset-fashion-mnist"):
        load_pool("fashion_mnist", root=str(tmp_path))


def test_unknown_name_lists_the_sources():
    with pytest.raises(ValueError, match="data.name: 'foo' is not one of .*digits, fashion_mnist"):
        load_pool("foo")


def test_unknown_parameter_names_the_field():
    with pytest.raises(
        ValueError, match="data.params.num_samples: not a parameter of source 'digits'"
    ):
        load_pool("digits", num_samples=10)


def test_bad_synthetic_shape():
    with pytest.raises(ValueError, match="data.shape"):
        load_pool("synthetic", shape=(8, 8))


def test_arrays_from_an_npz_file(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(12, 5, 5, 3), dtype=np.uint8)  # channels last
    y = np.array(["cat", "dog", "emu"] * 4)
    x_test, y_test = rng.integers(0, 256, size=(3, 5, 5, 3), dtype=np.uint8), y[:3]
    np.savez(tmp_path / "mine.npz", x=x, y=y, x_test=x_test, y_test=y_test)
    pool = load_pool("arrays", root=str(tmp_path), path="mine.npz")
    assert pool.x.shape == (15, 3, 5, 5) and pool.x.dtype == torch.uint8 and pool.scale == 255.0
    assert torch.equal(pool.x[0], torch.from_numpy(x[0]).permute(2, 0, 1))
    assert pool.class_names == ("cat", "dog", "emu") and pool.num_classes == 3
    assert pool.y.tolist() == [0, 1, 2] * 5 and pool.test_start == 12
    assert pool.source == str(tmp_path / "mine.npz")


def test_whole_number_float_labels_are_classes(tmp_path):
    np.savez(tmp_path / "floats.npz", x=np.zeros((4, 2)), y=np.array([1.0, 0.0, 1.0, 3.0]))
    pool = load_pool("arrays", path=str(tmp_path / "floats.npz"))
    assert pool.class_names == ("0.0", "1.0", "3.0") and pool.y.tolist() == [1, 0, 1, 2]


def test_arrays_of_float_vectors_without_a_test_split(tmp_path):
    x = np.linspace(-1, 1, 40, dtype=np.float64).reshape(10, 4)
    np.savez(tmp_path / "vectors.npz", x=x, y=np.arange(10) % 2 + 7)
    pool = load_pool("arrays", path=str(tmp_path / "vectors.npz"))
    assert pool.x.shape == (10, 1, 1, 4) and pool.x.dtype == torch.float32
    assert pool.scale == 1.0 and pool.test_start is None
    assert float(pool.x[0, 0, 0, 0]) == -1.0
    assert pool.class_names == ("7", "8") and pool.y.tolist() == [0, 1] * 5


@pytest.mark.parametrize(
    ("arrays", "problem"),
    [
        ({"x": np.zeros((4, 3, 3))}, "has no array 'x' / 'y'"),
        ({"x": np.zeros((4, 3, 3)), "y": np.zeros(3)}, "x has 4 samples, y 3"),
        ({"x": np.zeros((4, 2, 3, 3, 3)), "y": np.zeros(4)}, "x has shape (4, 2, 3, 3, 3)"),
        (
            {"x": np.array([[0.0, 1.0], [np.nan, 2.0], [3.0, np.inf]]), "y": np.arange(3)},
            "holds NaN or inf in 2 of 3 samples (the first: sample 1)",
        ),
        (
            {"x": np.zeros((3, 2)), "y": np.array([0.5, 1.5, 2.0])},
            "y holds 2 labels that are not class ids (0.5, 1.5, ...)",
        ),
        (
            {"x": np.zeros((3, 2)), "y": np.zeros(3), "x_test": np.zeros((1, 2))}
            | {"y_test": np.array([np.nan])},
            "y_test holds 1 labels that are not class ids (nan, ...)",
        ),
    ],
)
def test_bad_arrays_are_one_line(tmp_path, arrays, problem):
    np.savez(tmp_path / "bad.npz", **arrays)
    with pytest.raises(ValueError) as error:
        load_pool("arrays", path=str(tmp_path / "bad.npz"))
    assert str(error.value).startswith("data.params.path: ") and problem in str(error.value)
    with pytest.raises(ValueError, match="data.params.path: required by source 'arrays'"):
        load_pool("arrays")


def write_images(folder, colours: dict[str, list[tuple[int, int, int]]], side: int) -> None:
    from PIL import Image

    for label, pixels in colours.items():
        (folder / label).mkdir(parents=True)
        for i, colour in enumerate(pixels):
            Image.new("RGB", (side + i, side), colour).save(folder / label / f"{i}.png")


def test_image_folder_in_colour_and_grey(tmp_path):
    write_images(tmp_path / "imgs", {"red": [(255, 0, 0)] * 2, "blue": [(0, 0, 255)] * 3}, 9)
    pool = load_pool("image_folder", path=str(tmp_path / "imgs"), size=4)
    assert pool.x.shape == (5, 3, 4, 4) and pool.x.dtype == torch.uint8
    assert pool.class_names == ("blue", "red") and pool.y.tolist() == [0, 0, 0, 1, 1]
    assert pool.x[0, :, 0, 0].tolist() == [0, 0, 255] and pool.x[4, :, 0, 0].tolist() == [255, 0, 0]
    grey = load_pool("image_folder", root=str(tmp_path), path="imgs", size=6, grey=True)
    assert grey.x.shape == (5, 1, 6, 6)
    # ITU-R 601-2 luma, as PIL converts: L = 0.299 R + 0.587 G + 0.114 B
    assert grey.x[0, 0, 0, 0].item() == 29 and grey.x[4, 0, 0, 0].item() == 76


def test_image_folder_with_train_and_test_splits(tmp_path):
    write_images(tmp_path / "train", {"a": [(10, 10, 10)] * 3, "b": [(200, 200, 200)] * 3}, 5)
    write_images(tmp_path / "test", {"a": [(10, 10, 10)], "b": [(200, 200, 200)] * 2}, 5)
    pool = load_pool("image_folder", root=str(tmp_path), size=5, grey=True)
    assert len(pool.y) == 9 and pool.test_start == 6
    assert pool.y.tolist() == [0, 0, 0, 1, 1, 1, 0, 1, 1]
    with pytest.raises(ValueError, match="data.params.path: .* is not a folder"):
        load_pool("image_folder", path=str(tmp_path / "absent"))


def test_user_sources_run_through_the_config(tmp_path):
    from raymtl.config import ConfigError, parse_config
    from tests.conftest import digits_experiment

    np.savez(tmp_path / "mine.npz", x=np.zeros((6, 4, 4), np.uint8), y=np.arange(6) % 2)
    params = {"path": str(tmp_path / "mine.npz")}
    cfg = parse_config(
        digits_experiment(tmp_path, **{"data.name": "arrays", "data.params": params})
    )
    assert cfg.data.params == params
    bad = digits_experiment(tmp_path, **{"data.name": "arrays", "data.params": {"file": "x"}})
    with pytest.raises(ConfigError, match=r"^data.params.file: not a parameter of source 'arrays'"):
        parse_config(bad)
