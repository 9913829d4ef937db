"""Sources for a user's own data, without writing a loader: `arrays` (an .npz file) and
`image_folder` (a folder of class folders of images).

    data: {name: arrays, params: {path: my_data.npz}}
        x (N, H, W) | (N, C, H, W) | (N, H, W, C) with C 1 or 3 | (N, D) vectors (1x1xD);
        uint8 pixels (scale 255) or finite floats used as they are; y (N,) class labels of
        any discrete kind (ids, strings, whole-number floats: classes are their sorted
        distinct values; fractional floats, NaN and inf are refused). x_test and y_test,
        when the file has them, are the official test split.
    data: {name: image_folder, params: {path: my_images, size: 32, grey: false}}
        path/<class>/*.png|jpg|... (torchvision's ImageFolder layout; classes are the sorted
        folder names), every image resized to size x size, grey (1 channel) or colour (3).
        With path/train/<class>/ and path/test/<class>/, test is the official test split.

A relative `path` is looked up under `data.root` when it is set, else the current folder.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

from raymtl.data.source_registry import Pool, register_dataset

CHANNELS = (1, 3)


def _resolve(path: str | None, root: str | None, source: str) -> Path:
    if not path:
        raise ValueError(f"data.params.path: required by source {source!r}")
    resolved = Path(os.path.expanduser(path))
    if not resolved.is_absolute() and root:
        resolved = Path(os.path.expanduser(root)) / resolved
    return resolved.absolute()  # what a missing file's message names: the path tried


def _images(x: np.ndarray, field: str, file: Path | None = None) -> np.ndarray:
    """(N, C, H, W) from the layouts the module docstring lists (`file`: named in errors)."""
    if x.ndim == 2:  # feature vectors: a 1x1 image of D channels' worth of width
        return x[:, None, None, :]
    if x.ndim == 3:
        return x[:, None]
    if x.ndim == 4 and x.shape[1] not in CHANNELS and x.shape[-1] in CHANNELS:
        return x.transpose(0, 3, 1, 2)
    if x.ndim == 4:
        return x
    expected = "(N, H, W), (N, C, H, W), (N, H, W, C) or (N, D)"
    of = f" of '{file}'" if file is not None else ""
    raise ValueError(f"data.params.path: {field}{of} has shape {x.shape}; expected {expected}")


def check_finite(x: np.ndarray, field: str, file: Path, param: str = "path") -> None:
    """Features are finite numbers: a NaN or inf would make its client's every update
    non-finite, left out of every round without a word (`param`: the data.params field the
    message starts with)."""
    if not np.issubdtype(x.dtype, np.floating):
        return
    finite = np.isfinite(x.reshape(len(x), -1)).all(axis=1)
    if not finite.all():
        bad = np.flatnonzero(~finite)
        raise ValueError(
            f"data.params.{param}: {field} of '{file}' holds NaN or inf in {len(bad)} of "
            f"{len(x)} samples (the first: sample {bad[0]}); features must be finite numbers"
        )


def check_class_labels(
    y: np.ndarray, field: str, file: Path | None = None, param: str = "path"
) -> None:
    """Labels of a classification are discrete (ints, strings, or floats holding whole
    numbers): float values such as 0.5 would each become a class of their own (a regression
    target read as N classes). `file` is named in the message when given, which starts with
    `data.params.<param>`."""
    if not np.issubdtype(y.dtype, np.floating):
        return
    fractional = ~np.isfinite(y) | (y != np.round(y))
    if fractional.any():
        shown = ", ".join(f"{value:g}" for value in np.unique(y[fractional])[:3])
        of = f" of '{file}'" if file is not None else ""
        raise ValueError(
            f"data.params.{param}: {field}{of} holds {int(fractional.sum())} labels that are "
            f"not class ids ({shown}, ...), the first at sample {np.flatnonzero(fractional)[0]}: "
            "a classification needs discrete labels (ints or strings; floats only when they "
            "are whole numbers)"
        )


def class_ids(labels: np.ndarray) -> tuple[tuple[str, ...], np.ndarray]:
    """The classes (the sorted distinct labels, as strings) and each label's class id."""
    classes, ids = np.unique(labels, return_inverse=True)
    return tuple(str(name) for name in classes), ids.reshape(-1).astype(np.int64)


def sample_tensor(x: np.ndarray, field: str = "x") -> tuple[torch.Tensor, float]:
    """The samples as Pool.x and its scale: uint8 pixels as they are (scale 255), other
    numbers as float32 (scale 1)."""
    if x.dtype == np.uint8:
        return torch.from_numpy(np.ascontiguousarray(x)), 255.0
    if np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_:
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), 1.0
    raise ValueError(f"data.params.path: {field} holds {x.dtype}, not numbers")


def _pool(splits: list[tuple[np.ndarray, np.ndarray]], source: str) -> Pool:
    """One Pool of the splits (train first), classes the sorted distinct labels of all."""
    names, ids = class_ids(np.concatenate([y for _, y in splits]))
    tensor, scale = sample_tensor(np.concatenate([x for x, _ in splits]))
    test_start = len(splits[0][1]) if len(splits) > 1 else None
    return Pool(tensor, torch.from_numpy(ids), len(names), names, scale, source, test_start)


@register_dataset("arrays")
def load_arrays(root: str | None = None, download: bool = False, path: str | None = None) -> Pool:
    """Your own arrays: an .npz file with x and y (and optionally x_test, y_test)."""
    file = _resolve(path, root, "arrays")
    if not file.is_file():
        raise ValueError(f"data.params.path: '{file}' is not a file (an .npz with x and y)")
    try:
        arrays = np.load(file, allow_pickle=False)
    except (OSError, ValueError) as error:
        raise ValueError(f"data.params.path: '{file}' is not an .npz file ({error})") from None
    splits = []
    for x_key, y_key in (("x", "y"), ("x_test", "y_test")):
        if x_key not in arrays and x_key == "x_test":
            continue
        if x_key not in arrays or y_key not in arrays:
            raise ValueError(f"data.params.path: '{file}' has no array {x_key!r} / {y_key!r}")
        x, y = _images(arrays[x_key], x_key), arrays[y_key].reshape(-1)
        if len(x) != len(y) or len(x) == 0:
            raise ValueError(f"data.params.path: {x_key} has {len(x)} samples, {y_key} {len(y)}")
        check_finite(x, x_key, file)
        check_class_labels(y, y_key)
        splits.append((x, y))
    if len(splits) > 1 and splits[0][0].shape[1:] != splits[1][0].shape[1:]:
        raise ValueError("data.params.path: x and x_test samples differ in shape")
    return _pool(splits, str(file))


@register_dataset("image_folder")
def load_image_folder(
    root: str | None = None,
    download: bool = False,
    path: str | None = None,
    size: int = 32,
    grey: bool = False,
) -> Pool:
    """Your own images: path/<class>/*.png (ImageFolder layout), resized to size x size."""
    folder = _resolve(path or root, None if not path else root, "image_folder")
    if not folder.is_dir():
        raise ValueError(f"data.params.path: '{folder}' is not a folder of class folders")
    check_size(size)
    split_folders = [folder / "train", folder / "test"]
    if not all(split.is_dir() for split in split_folders):
        split_folders = [folder]
    classes = sorted(
        {child.name for split in split_folders for child in split.iterdir() if child.is_dir()}
    )
    if not classes:
        raise ValueError(f"data.params.path: '{folder}' has no class folders")
    splits = [_read_split(split, classes, size, grey) for split in split_folders]
    return _pool(splits, str(folder))


def check_size(size: object) -> None:
    """`data.params.size` (the side images are resized to) is a positive integer."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"data.params.size: {size!r} is not a positive integer")


def image_pixels(image_file, size: int, grey: bool) -> np.ndarray:
    """One image (a path or a binary file object) as (C, size, size) uint8, C 1 (grey) or 3;
    PIL's errors (OSError for what is not an image) reach the caller."""
    from PIL import Image  # only the sources of image files read them

    with Image.open(image_file) as image:
        image = image.convert("L" if grey else "RGB").resize((size, size), Image.BILINEAR)
        pixels = np.asarray(image, dtype=np.uint8)
    return pixels[None] if grey else pixels.transpose(2, 0, 1)


def _read_split(folder: Path, classes: list[str], size: int, grey: bool):
    from torchvision.datasets.folder import IMG_EXTENSIONS, make_dataset

    index = {name: i for i, name in enumerate(classes)}
    present = {name: i for name, i in index.items() if (folder / name).is_dir()}
    try:
        samples = make_dataset(str(folder), present, extensions=IMG_EXTENSIONS)
    except FileNotFoundError as error:  # a class folder without images
        raise ValueError(f"data.params.path: {' '.join(str(error).split())}") from None
    images = [image_pixels(file, size, grey) for file, _ in samples]
    labels = np.array([classes[label] for _, label in samples])
    return np.stack(images), labels
