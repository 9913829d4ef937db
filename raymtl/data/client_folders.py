"""A source of data already split by client: a folder per client (`client_folders`). Its pools
are keyed by client (`Pool.keys`): the default partition `natural` gives the federation's
client k exactly the samples of the data's k-th client, the clients in the sorted order of
their ids.

    data: {name: client_folders, params: {path: my_clients, size: 32, grey: false}}
        path/<client>/ per client (hidden folders skipped), each holding either class
        folders of images, path/<client>/<class>/*.png|jpg|... (resized to size x size,
        grey or RGB, uint8), with path/<client>/train/<class>/ and path/<client>/test/<class>/
        for a given test split; or one .npz file with x and y (and optionally x_test and
        y_test), x as `arrays` takes it. Classes are the sorted union of all clients' labels.
        Either every client gives a test split or none does.

A relative `path` is looked up under `data.root` when it is set, else the current folder.
Every data check is a one-line ValueError naming the file, the field and the first bad
sample (or row): NaN or inf features, fractional labels, x, y and client of different
lengths, a client without samples, keys that disagree with the data, a missing file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raymtl.data.source_registry import Pool, register_dataset
from raymtl.data.table_source import _joined_labels, _keyed_pool, _npz_split, _open_npz
from raymtl.data.user_sources import _resolve, check_size, image_pixels


@register_dataset("client_folders", keyed=True)
def load_client_folders(
    root: str | None = None,
    download: bool = False,
    path: str | None = None,
    size: int = 32,
    grey: bool = False,
) -> Pool:
    """A folder per client: path/<client>/<class>/*.png, or path/<client>/<one>.npz."""
    folder = _resolve(path, root, "client_folders")
    if not folder.is_dir():
        raise ValueError(
            f"data.params.path: '{folder}' is not a folder (a folder per client: "
            "path/<client>/<class>/*.png or path/<client>/data.npz)"
        )
    check_size(size)
    names = tuple(sorted(child.name for child in _subfolders(folder)))
    if not names:
        raise ValueError(f"data.params.path: '{folder}' holds no client folders")
    clients = [_client_samples(folder / name, size, grey) for name in names]
    with_test = [len(splits) > 1 for splits, _ in clients]
    if any(with_test) and not all(with_test):
        k = with_test.index(False)
        given = names[with_test.index(True)]
        raise ValueError(
            f"data.params.path: client folder '{folder / names[k]}' gives no test split but "
            f"'{given}' does: give every client a test split, or none"
        )
    first_x, first_vectors = clients[0][0][0][0], clients[0][1]
    for k, (splits, vectors) in enumerate(clients):
        for x, _ in splits:
            same = x.shape[1:] == first_x.shape[1:] and (x.dtype == np.uint8) == (
                first_x.dtype == np.uint8
            )
            if not same or vectors != first_vectors:
                raise ValueError(
                    f"data.params.path: client folder '{folder / names[k]}' holds samples of "
                    f"shape {x.shape[1:]} {x.dtype}, client '{names[0]}' {first_x.shape[1:]} "
                    f"{first_x.dtype}: every client's samples must have one shape"
                )
    x = np.concatenate([x for splits, _ in clients for x, _ in splits])
    labels = _joined_labels([y for splits, _ in clients for _, y in splits])
    counts = [len(y) for splits, _ in clients for _, y in splits]
    owners = [k for k, (splits, _) in enumerate(clients) for _ in splits]
    client = np.repeat(np.asarray(owners, dtype=np.int64), counts)
    test = None
    if all(with_test):
        test = np.repeat(np.tile([False, True], len(names)), counts)
    inputs = "vectors" if first_vectors else "images"
    return _keyed_pool(x, labels, client, names, str(folder), test, None, inputs)


def _subfolders(folder: Path) -> list[Path]:
    return sorted(
        child for child in folder.iterdir() if child.is_dir() and not child.name.startswith(".")
    )


def _client_samples(folder: Path, size: int, grey: bool):
    """A client's splits [(x, y)] (train, and test when given) and whether x are vectors."""
    npz = sorted(
        child for child in folder.iterdir() if child.is_file() and child.suffix.lower() == ".npz"
    )
    subfolders = _subfolders(folder)
    if npz and subfolders:
        raise ValueError(
            f"data.params.path: client folder '{folder}' holds both an .npz file and folders; "
            "give one or the other"
        )
    if len(npz) > 1:
        shown = ", ".join(child.name for child in npz)
        raise ValueError(
            f"data.params.path: client folder '{folder}' holds {len(npz)} .npz files "
            f"({shown}); give one"
        )
    if npz:
        arrays = _open_npz(npz[0])
        splits, vectors = [], False
        for x_key, y_key in (("x", "y"), ("x_test", "y_test")):
            if x_key == "x_test" and x_key not in arrays and y_key not in arrays:
                continue
            x, y, _, vectors_here = _npz_split(arrays, npz[0], x_key, y_key)
            splits.append((x, y))
            vectors = vectors or vectors_here
        if len(splits) > 1 and splits[0][0].shape[1:] != splits[1][0].shape[1:]:
            raise ValueError(f"data.params.path: x and x_test of '{npz[0]}' differ in shape")
        return splits, vectors
    names = {child.name for child in subfolders}
    parts = [folder / "train", folder / "test"] if {"train", "test"} <= names else [folder]
    splits = [_class_images(part, size, grey) for part in parts]
    if sum(len(y) for _, y in splits) == 0:
        raise ValueError(
            f"data.params.path: client folder '{folder}' holds no samples (class folders of "
            "images, or one .npz with x and y)"
        )
    return splits, False


def _class_images(folder: Path, size: int, grey: bool):
    """(x (n, C, size, size) uint8, labels (n,) str) of folder/<class>/ images (class
    folders in sorted order, each one's images in sorted order, subfolders included)."""
    from torchvision.datasets.folder import IMG_EXTENSIONS

    images, labels = [], []
    for class_folder in _subfolders(folder):
        files = sorted(
            file
            for file in class_folder.rglob("*")
            if file.is_file() and file.name.lower().endswith(IMG_EXTENSIONS)
        )
        for file in files:
            try:
                images.append(image_pixels(file, size, grey))
            except (OSError, ValueError) as error:
                message = " ".join(str(error).split())
                raise ValueError(
                    f"data.params.path: '{file}' is not an image ({message})"
                ) from None
            labels.append(class_folder.name)
    channels = 1 if grey else 3
    x = np.stack(images) if images else np.zeros((0, channels, size, size), np.uint8)
    return x, np.asarray(labels, dtype=str)
