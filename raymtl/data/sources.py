"""The built-in dataset sources: sklearn's digits, MNIST, Fashion-MNIST, CIFAR-10/100 (each
joining its official train and test splits) and seeded synthetic images. Each is registered
(`register_dataset`, source_registry.py) under the name `data.name` gives it.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from raymtl.data.pool_cache import cached_pool
from raymtl.data.source_registry import DatasetMissing, Pool, register_dataset

# torchvision is imported inside the loaders that need it: importing it costs seconds, and
# every client actor imports this module (digits and synthetic do not need it).

# Where Debian's `dataset-fashion-mnist` package puts the idx files; a module constant so
# tests can point it elsewhere.
DEBIAN_FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"
DEFAULT_CACHE_ROOT = "~/.cache/raymtl"

_IDX_SPLITS = (
    ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
)


def _missing(name: str, root: str | None, download: bool, error: Exception) -> DatasetMissing:
    looked = repr(root) if root else f"{DEFAULT_CACHE_ROOT} (data.root unset)"
    apt = ", apt-get install dataset-fashion-mnist" if name == "fashion_mnist" else ""
    detail = " ".join(str(error).split())  # keep one line even if torchvision's message wraps
    fetch = f"download failed: {detail}" if download else "or set data.download=true"
    return DatasetMissing(
        f"data.root: no {name} in {looked}; set data.root to a folder holding it{apt}; {fetch}"
    )


def _sklearn_digits_file() -> Path | None:
    """The file sklearn's `load_digits` reads (found without importing sklearn), or None."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    return path if path.is_file() else None


@register_dataset("digits")
def _load_digits(root: str | None = None, download: bool = False) -> Pool:
    """sklearn's bundled 8x8 digits (1797 images, values 0..16); decoded once per sklearn
    install and then read from the pool cache (pool_cache.py: sklearn's import is the cost)."""
    bundled = _sklearn_digits_file()
    return cached_pool("digits", [bundled], _decode_digits) if bundled else _decode_digits()


def _decode_digits() -> Pool:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = torch.from_numpy(bunch.images.astype(np.uint8)).unsqueeze(1)
    names = tuple(str(name) for name in bunch.target_names)
    y = torch.from_numpy(bunch.target.astype(np.int64))
    return Pool(x, y, len(names), names, 16.0, "sklearn")


def _idx_path(directory: Path, stem: str) -> Path | None:
    for candidate in (directory / stem, directory / f"{stem}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _find_idx_dir(candidates: list[Path]) -> Path | None:
    for directory in candidates:
        stems = [stem for split in _IDX_SPLITS for stem in split]
        if all(_idx_path(directory, stem) for stem in stems):
            return directory
    return None


def _read_idx(path: Path, reader: Callable[[str], torch.Tensor]) -> torch.Tensor:
    from torchvision.datasets.utils import extract_archive

    if path.suffix != ".gz":
        return reader(str(path))
    # torchvision's readers take plain files; decompress next to nothing permanent since the
    # source directory (e.g. /usr/share) is usually read-only.
    with tempfile.TemporaryDirectory() as scratch:
        return reader(extract_archive(str(path), scratch))


def _pool_from_idx_dir(directory: Path, class_names: list[str]) -> Pool:
    from torchvision.datasets.mnist import read_image_file, read_label_file

    images, labels = [], []
    for image_stem, label_stem in _IDX_SPLITS:
        images.append(_read_idx(_idx_path(directory, image_stem), read_image_file))
        labels.append(_read_idx(_idx_path(directory, label_stem), read_label_file))
    x = torch.cat(images).unsqueeze(1)
    names = tuple(class_names)
    labels_all = torch.cat(labels).long()
    return Pool(x, labels_all, len(names), names, 255.0, str(directory), len(images[0]))


def _pool_from_torchvision(name: str, dataset: type, root: str | None, download: bool) -> Pool:
    """Join the train and test splits of torchvision `dataset` stored under `root`."""
    folder = os.path.expanduser(root or DEFAULT_CACHE_ROOT)
    try:
        splits = [dataset(folder, train=train, download=download) for train in (True, False)]
    except (RuntimeError, OSError) as error:  # "Dataset not found", or a failed download
        raise _missing(name, root, download, error) from error
    x = torch.cat([torch.as_tensor(np.asarray(split.data)) for split in splits])
    if x.ndim == 3:
        x = x.unsqueeze(1)
    elif x.shape[-1] == 3:  # CIFAR stores HWC
        x = x.permute(0, 3, 1, 2).contiguous()
    y = torch.cat([torch.as_tensor(split.targets, dtype=torch.int64) for split in splits])
    names = tuple(str(class_name) for class_name in splits[0].classes)
    return Pool(x, y, len(names), names, 255.0, folder, len(splits[0].targets))


@register_dataset("fashion_mnist")
def _load_fashion_mnist(root: str | None = None, download: bool = False) -> Pool:
    """Fashion-MNIST: `root`, then Debian's package, then torchvision (optionally downloading)."""
    candidates = [Path(root), Path(root) / "FashionMNIST" / "raw"] if root else []
    directory = _find_idx_dir([*candidates, Path(DEBIAN_FASHION_MNIST_DIR)])
    if directory is not None:  # decoded once, then read from the pool cache (pool_cache.py):
        # a cached pool needs no torchvision import either (about 1 s)
        files = [_idx_path(directory, stem) for split in _IDX_SPLITS for stem in split]
        return cached_pool("fashion_mnist", files, functools.partial(_fashion_idx, directory))
    import torchvision.datasets as tvd

    return _pool_from_torchvision("fashion_mnist", tvd.FashionMNIST, root, download)


def _fashion_idx(directory: Path) -> Pool:
    import torchvision.datasets as tvd

    return _pool_from_idx_dir(directory, tvd.FashionMNIST.classes)


@register_dataset("mnist")
def _load_mnist(root: str | None = None, download: bool = False) -> Pool:
    """MNIST through torchvision (root/MNIST/raw/)."""
    import torchvision.datasets as tvd

    return _pool_from_torchvision("mnist", tvd.MNIST, root, download)


@functools.cache
def _files_present(name: str) -> type:
    """torchvision's CIFAR class `name`, trusting its files by existence.

    torchvision verifies md5s of the full-size batch files; trusting existence lets tests use
    tiny files in the real on-disk format. Parsing stays torchvision's.
    """
    import torchvision.datasets as tvd
    from torchvision.datasets.utils import check_integrity

    base = getattr(tvd, name)

    def _check_integrity(self) -> bool:
        folder = os.path.join(self.root, self.base_folder)
        files = self.train_list + self.test_list
        return all(check_integrity(os.path.join(folder, file)) for file, _ in files)

    # md5=None: _load_meta then checks the meta file's existence only.
    namespace = {"_check_integrity": _check_integrity, "meta": {**base.meta, "md5": None}}
    return type(f"{name}Present", (base,), namespace)


@register_dataset("cifar10")
def _load_cifar10(root: str | None = None, download: bool = False) -> Pool:
    """CIFAR-10 through torchvision (root/cifar-10-batches-py/)."""
    return _pool_from_torchvision("cifar10", _files_present("CIFAR10"), root, download)


@register_dataset("cifar100")
def _load_cifar100(root: str | None = None, download: bool = False) -> Pool:
    """CIFAR-100 (fine labels) through torchvision (root/cifar-100-python/)."""
    return _pool_from_torchvision("cifar100", _files_present("CIFAR100"), root, download)


@register_dataset("synthetic")
def _load_synthetic(
    root: str | None = None,
    download: bool = False,
    seed: int = 0,
    num_samples: int = 2000,
    num_classes: int = 10,
    shape: tuple[int, int, int] = (1, 8, 8),
    noise: float = 1.0,
) -> Pool:
    """Seeded class-conditional Gaussian images around a random mean image per class."""
    shape = tuple(int(size) for size in shape)
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"data.shape: {shape} must be three positive sizes (C, H, W)")
    if num_classes < 1 or num_samples < num_classes:
        raise ValueError(
            f"data.num_samples: {num_samples} must be >= data.num_classes ({num_classes}) >= 1"
        )
    if noise < 0:
        raise ValueError(f"data.noise: {noise} must be >= 0")
    rng = np.random.default_rng(seed)
    means = rng.normal(size=(num_classes, *shape))
    labels = rng.permutation(np.arange(num_samples) % num_classes)
    samples = means[labels] + noise * rng.normal(size=(num_samples, *shape))
    span = max(samples.max() - samples.min(), 1e-12)
    x = torch.from_numpy(((samples - samples.min()) / span).astype(np.float32))
    names = tuple(f"class_{label}" for label in range(num_classes))
    return Pool(x, torch.from_numpy(labels.astype(np.int64)), num_classes, names, 1.0, "synthetic")
