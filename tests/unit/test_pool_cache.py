"""Decoded pools kept on disk between processes (data/pool_cache.py): the cached pool is the
decoded one, a changed source file is decoded again, and the cache can be off or unwritable
without a run noticing."""

from __future__ import annotations

import os

import pytest
import torch

from raymtl.data import SOURCES, pool_cache
from tests.unit.test_sources import write_idx_dataset


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYMTL_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def entries(home):
    folder = home / "cache" / "pools"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def assert_same_pool(ours, theirs):
    assert torch.equal(ours.x, theirs.x) and ours.x.dtype == theirs.x.dtype
    assert torch.equal(ours.y, theirs.y)
    for field in ("num_classes", "class_names", "scale", "source", "test_start"):
        assert getattr(ours, field) == getattr(theirs, field), field


def test_a_cached_fashion_mnist_is_the_decoded_one_and_a_changed_file_is_decoded_again(
    tmp_path, home, monkeypatch
):
    write_idx_dataset(tmp_path / "fmnist", compress=True)
    load = SOURCES["fashion_mnist"]
    decoded = load(root=str(tmp_path / "fmnist"))
    (entry,) = entries(home)
    assert entry.startswith("fashion_mnist-")
    decodes = []
    monkeypatch.setattr(
        "raymtl.data.sources._pool_from_idx_dir", lambda *a: decodes.append(a) or decoded
    )
    assert_same_pool(load(root=str(tmp_path / "fmnist")), decoded)  # read back from disk
    assert decodes == []
    labels = tmp_path / "fmnist" / "train-labels-idx1-ubyte.gz"
    os.utime(labels, ns=(labels.stat().st_atime_ns, labels.stat().st_mtime_ns + 10**9))
    load(root=str(tmp_path / "fmnist"))
    assert len(decodes) == 1 and len(entries(home)) == 2  # a new key for the changed file


def test_digits_come_from_the_cache_without_importing_sklearn_again(home, monkeypatch):
    first = SOURCES["digits"]()
    assert entries(home)[0].startswith("digits-")

    def no_decoding():
        raise AssertionError("sklearn's digits decoded again")

    monkeypatch.setattr("raymtl.data.sources._decode_digits", no_decoding)
    assert_same_pool(SOURCES["digits"](), first)
    assert first.x.shape == (1797, 1, 8, 8) and first.x.dtype == torch.uint8


def test_the_cache_off_or_unwritable_still_gives_the_pool(tmp_path, home, monkeypatch):
    write_idx_dataset(tmp_path / "fmnist")
    monkeypatch.setenv("RAYMTL_POOL_CACHE", "0")
    off = SOURCES["fashion_mnist"](root=str(tmp_path / "fmnist"))
    assert entries(home) == []
    monkeypatch.delenv("RAYMTL_POOL_CACHE")
    home.mkdir()
    (home / "cache").write_text("a file where the cache folder would be")
    assert_same_pool(SOURCES["fashion_mnist"](root=str(tmp_path / "fmnist")), off)


def test_a_damaged_entry_is_decoded_again(tmp_path, home):
    write_idx_dataset(tmp_path / "fmnist")
    decoded = SOURCES["fashion_mnist"](root=str(tmp_path / "fmnist"))
    (entry,) = entries(home)
    (home / "cache" / "pools" / entry / "x.npy").write_bytes(b"not an array")
    assert_same_pool(SOURCES["fashion_mnist"](root=str(tmp_path / "fmnist")), decoded)
    assert_same_pool(pool_cache.read_entry(home / "cache" / "pools" / entry), decoded)
