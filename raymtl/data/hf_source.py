"""`data.name: hf`: a Hugging Face dataset, partitioned into clients by Flower Datasets.

    data:
      name: hf
      params:
        path: my_dataset          # a save_to_disk folder, Parquet file(s) or an image folder
        # hub: ylecun/mnist       # or a hub name (needs the network; data.root: its cache)
        split: train              # the split that is partitioned (a DatasetDict's)
        test_split: test          # optional: each client's given test samples
        image_column: image       # or features: [f0, f1, ...] (numeric columns: vectors)
        label_column: label
        partitioner: {name: dirichlet, alpha: 0.5}   # iid | dirichlet | pathological |
                                                     # shard | natural (partition_by: writer)

Which client holds each sample is what Flower Datasets' partitioner says (the partitioning is
theirs, not rewritten here): client k holds partition k, named by the partition column's value
for `natural`, else "0".."K-1". The partitioner's arguments are its own (Flower's names), with
num_partitions = data.num_clients (else 20), partition_by = label_column and seed = the
experiment's seed unless given; `natural` needs its partition_by (the column naming each
sample's client). With a test_split, a second partitioner of the same kind (natural: by the
same column) splits it, and its samples are their clients' test split; without one,
data.partition.test_fraction splits each client's samples. Samples a partitioner leaves out
(a shard partitioner's incomplete shard, a class no pathological partition takes) are dropped.

Features: the image column (decoded, resized to size x size, grey or RGB) or the numeric
feature columns (float32 vectors); by default the dataset's Image column if it has one, else
every numeric column but the label and the partition column. Labels: a ClassLabel keeps its
names; other labels are classes by their sorted distinct values (fractional floats refused).

`datasets` and `flwr-datasets` are the optional extra `raymtl[hf]`, imported only when this
source loads.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import numpy as np
import torch

from raymtl.data.source_registry import ClientKeys, Pool, register_dataset
from raymtl.data.user_sources import _resolve, check_class_labels, check_finite

# `data.params.partitioner.name` -> the Flower Datasets partitioner class it makes.
PARTITIONERS = {
    "iid": "IidPartitioner",
    "dirichlet": "DirichletPartitioner",
    "pathological": "PathologicalPartitioner",
    "shard": "ShardPartitioner",
    "natural": "NaturalIdPartitioner",
}
# Partitioners whose partition_by names the clients, not the classes: no label default.
_CLIENT_COLUMN = frozenset({"natural"})
DEFAULT_CLIENTS = 20
INDEX = "__raymtl_index__"  # each sample's row, carried through the partitioner
_NUMERIC = ("int", "uint", "float", "bool")
_EXTRA = "data.name: 'hf' needs the optional extra: pip install 'raymtl[hf]'"


def _line(error: BaseException) -> str:
    """An exception as one line: its type and its message's words."""
    words = " ".join(str(error).split())
    return f"{type(error).__name__}: {words}" if words else type(error).__name__


def _libraries():
    """`datasets` and `flwr_datasets.partitioner`, imported now (the optional extra)."""
    try:
        import datasets
        import flwr_datasets.partitioner as partitioners
    except ImportError:
        raise ValueError(_EXTRA) from None
    return datasets, partitioners


@register_dataset("hf", keyed=True)
def load_hf(
    root: str | None = None,
    download: bool = False,
    seed: int = 0,
    num_clients: int | None = None,
    path: str | None = None,
    hub: str | None = None,
    split: str = "train",
    test_split: str | None = None,
    features: list[str] | None = None,
    image_column: str | None = None,
    label_column: str = "label",
    partitioner: dict | None = None,
    size: int = 32,
    grey: bool = False,
) -> Pool:
    """A Hugging Face dataset (a folder, Parquet, images or the hub) split by Flower Datasets."""
    datasets, library = _libraries()
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise ValueError(f"data.params.size: {size!r} is not a positive integer")
    train, test, where = _read(datasets, path, hub, root, split, test_split)
    spec = _partitioner_spec(partitioner)
    made, by = _make_partitioner(library, spec, num_clients, seed, label_column)
    for part, name in ((train, split), (test, test_split)):
        if part is not None:
            _check_columns(part, name, where, label_column, by)
    inputs, columns = _feature_columns(datasets, train, image_column, features, label_column, by)
    client, ids = _assign(made, train, by, split, where)
    parts = [(train, client)]
    if test is not None:
        again, _ = _make_partitioner(library, spec, num_clients, seed, label_column)
        test_client, test_ids = _assign(again, test, by, test_split, where)
        parts.append((test, _same_clients(test_client, test_ids, ids, test_split, where)))
    kept = []
    for part, owner in parts:  # the samples a partitioner left out are no client's
        rows = np.flatnonzero(owner >= 0)
        kept.append((part if rows.size == len(part) else part.select(rows), owner[rows]))
    y, class_names = _labels(datasets, [part for part, _ in kept], label_column, where)
    xs = [_inputs(part, inputs, columns, size, grey, where) for part, _ in kept]
    x = np.concatenate(xs)
    if inputs == "vectors":
        tensor, scale = torch.from_numpy(np.ascontiguousarray(x[:, None, None, :])), 1.0
    else:
        tensor, scale = torch.from_numpy(np.ascontiguousarray(x)), 255.0
    n_train = len(kept[0][1])
    test_mask = None
    if test is not None:
        test_mask = np.arange(len(y)) >= n_train
    keys = ClientKeys(
        client=np.concatenate([owner for _, owner in kept]).astype(np.int64),
        names=tuple(str(name) for name in ids),
        test=test_mask,
        where=where,
    )
    return Pool(
        x=tensor,
        y=torch.from_numpy(y),
        num_classes=len(class_names),
        class_names=class_names,
        scale=scale,
        source=where,
        test_start=n_train if test is not None else None,
        keys=keys,
        inputs=inputs,
    )


# --- reading -------------------------------------------------------------------------------


def _read(datasets, path, hub, root, split, test_split):
    """(the split to partition, the test split or None, where they came from)."""
    if (path is None) == (hub is None):
        raise ValueError(
            "data.params.path: source 'hf' reads a save_to_disk folder, Parquet file(s) or an "
            "image folder (path), or a hub dataset (hub): give one of path and hub"
        )
    if hub is not None:
        where = f"hub:{hub}"
        try:
            loaded = datasets.load_dataset(hub, cache_dir=root)
        except Exception as error:  # offline, unknown name, gated, a broken download, ...
            raise ValueError(f"data.params.hub: could not load {hub!r} ({_line(error)})") from None
    else:
        file = _resolve(path, root, "hf")
        where = str(file)
        loaded = _read_local(datasets, file)
    if isinstance(loaded, datasets.DatasetDict):
        for key, name in (("split", split), ("test_split", test_split)):
            if name is not None and name not in loaded:
                held = ", ".join(loaded) or "none"
                raise ValueError(f"data.params.{key}: {where} has no split {name!r} ({held})")
        train, test = loaded[split], loaded[test_split] if test_split is not None else None
    elif test_split is not None:
        raise ValueError(f"data.params.test_split: {where} holds one dataset, not splits")
    else:
        train, test = loaded, None
    for part, name in ((train, split), (test, test_split)):
        if part is not None and len(part) == 0:
            raise ValueError(f"data.params.path: split {name!r} of {where} holds no samples")
    return train, test, where


def _read_local(datasets, file: Path):
    """A save_to_disk folder, Parquet file(s) (a file, a glob, a folder of them) or an image
    folder (datasets' imagefolder: class folders, optionally under train/ and test/)."""
    saved = ("dataset_info.json", "dataset_dict.json", "state.json")
    try:
        if file.is_dir() and any((file / name).is_file() for name in saved):
            return datasets.load_from_disk(str(file))
        if file.suffix == ".parquet" and (file.is_file() or "*" in file.name):
            return datasets.load_dataset("parquet", data_files=str(file))
        if file.is_dir() and any(file.rglob("*.parquet")):
            return datasets.load_dataset("parquet", data_dir=str(file))
        if file.is_dir():
            return datasets.load_dataset("imagefolder", data_dir=str(file))
    except Exception as error:  # a corrupt folder or file, images it cannot decode, ...
        raise ValueError(f"data.params.path: could not read '{file}' ({_line(error)})") from None
    raise ValueError(
        f"data.params.path: '{file}' is not a save_to_disk folder, a Parquet file or a folder "
        "of Parquet files or images"
    )


# --- partitioning (Flower Datasets') -------------------------------------------------------


def _partitioner_spec(partitioner) -> dict:
    spec = {"name": "iid"} if partitioner is None else partitioner
    if isinstance(spec, str):
        spec = {"name": spec}
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise ValueError(
            f"data.params.partitioner: {partitioner!r} is not a mapping "
            f"{{name: {' | '.join(PARTITIONERS)}, ...its arguments}}"
        )
    if spec["name"] not in PARTITIONERS:
        raise ValueError(
            f"data.params.partitioner: {spec['name']!r} is not one of {', '.join(PARTITIONERS)}"
        )
    return dict(spec)


def _make_partitioner(library, spec: dict, num_clients, seed: int, label_column: str):
    """(the Flower Datasets partitioner `spec` names, with its arguments checked; the column
    it partitions by, None for iid)."""
    options = {key: value for key, value in spec.items() if key != "name"}
    name = spec["name"]
    kind = getattr(library, PARTITIONERS[name])
    accepted = {
        key: parameter
        for key, parameter in inspect.signature(kind).parameters.items()
        if parameter.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }
    allowed = ", ".join(accepted)
    for key in options:
        if key not in accepted:
            raise ValueError(
                f"data.params.partitioner.{key}: not an argument of {name!r} "
                f"({PARTITIONERS[name]}: {allowed})"
            )
    defaults = {"num_partitions": num_clients or DEFAULT_CLIENTS, "seed": seed}
    if name not in _CLIENT_COLUMN:
        defaults["partition_by"] = label_column
    arguments = {key: value for key, value in defaults.items() if key in accepted} | options
    for key, parameter in accepted.items():
        if parameter.default is inspect.Parameter.empty and key not in arguments:
            raise ValueError(
                f"data.params.partitioner.{key}: required by {name!r} "
                f"({PARTITIONERS[name]}: {allowed})"
            )
    try:
        return kind(**arguments), arguments.get("partition_by")
    except (TypeError, ValueError) as error:
        raise ValueError(f"data.params.partitioner: {name} {_line(error)}") from None


def _assign(partitioner, dataset, by: str | None, split: str, where: str):
    """(each row's partition, -1 for rows in none; the partitions' ids: natural ids, else
    0..K-1), by Flower's own `load_partition` on the rows numbered by an index column."""
    carried = [by] if by is not None else dataset.column_names[:1]  # a table keeps its rows
    slim = dataset.select_columns(carried).add_column(INDEX, np.arange(len(dataset)))
    if by is None:
        slim = slim.remove_columns(carried)
    partitioner.dataset = slim
    client = np.full(len(dataset), -1, dtype=np.int64)
    sizes = []
    count = partitioner.num_partitions
    if count > len(dataset):
        raise ValueError(
            f"data.params.partitioner: {count} partitions of the {len(dataset)} samples of "
            f"split {split!r} of {where} leave some empty; give fewer clients "
            "(data.num_clients, or the partitioner's num_partitions)"
        )
    try:
        for k in range(count):
            partition = partitioner.load_partition(k).select_columns([INDEX])
            rows = partition.with_format("numpy")[:][INDEX].astype(np.int64)
            client[rows] = k
            sizes.append(rows.size)
    except (TypeError, ValueError, KeyError, IndexError) as error:
        raise ValueError(f"data.params.partitioner: {_line(error)}") from None
    natural = getattr(partitioner, "partition_id_to_natural_id", None)
    ids = [natural[k] for k in range(len(sizes))] if natural else list(range(len(sizes)))
    for k, size in enumerate(sizes):
        if size == 0:
            raise ValueError(
                f"data.params.partitioner: client '{ids[k]}' gets no samples of split "
                f"{split!r} of {where} ({len(sizes)} partitions of {len(dataset)} samples); give "
                "min_partition_size, a larger alpha, or fewer clients (data.num_clients)"
            )
    return client, ids


def _same_clients(client, ids, train_ids, split: str, where: str) -> np.ndarray:
    """The test split's partitions as the train split's clients (by natural id)."""
    index = {key: k for k, key in enumerate(train_ids)}
    missing = [key for key in ids if key not in index]
    if missing:
        raise ValueError(
            f"data.params.test_split: client '{missing[0]}' of split {split!r} of {where} "
            f"holds no training samples ({len(missing)} such clients)"
        )
    mapping = np.array([index[key] for key in ids], dtype=np.int64)
    return np.where(client >= 0, mapping[np.maximum(client, 0)], -1)


# --- columns -------------------------------------------------------------------------------


def _check_columns(dataset, split, where: str, label_column: str, by: str | None) -> None:
    held = ", ".join(dataset.column_names)
    for key, column in (("label_column", label_column), ("partitioner.partition_by", by)):
        if column is not None and column not in dataset.column_names:
            raise ValueError(
                f"data.params.{key}: split {split!r} of {where} has no column {column!r} ({held})"
            )


def _numeric(datasets, feature) -> bool:
    """A column of numbers: a numeric Value, or lists or arrays of numbers."""
    if isinstance(feature, datasets.Value) or type(feature).__name__.startswith("Array"):
        return str(getattr(feature, "dtype", "")).startswith(_NUMERIC)
    inner = getattr(feature, "feature", None)
    return inner is not None and not isinstance(inner, dict) and _numeric(datasets, inner)


def _feature_columns(datasets, dataset, image_column, features, label_column, by):
    """("images", [the image column]) or ("vectors", [the numeric columns])."""
    held = dataset.features
    names = ", ".join(held)
    if image_column is not None and features is not None:
        raise ValueError("data.params.features: give features or image_column, not both")
    if image_column is not None:
        if image_column not in held:
            raise ValueError(f"data.params.image_column: no column {image_column!r} ({names})")
        return "images", [image_column]
    if features is not None:
        columns = [features] if isinstance(features, str) else list(features)
        for column in columns:
            if column not in held:
                raise ValueError(f"data.params.features: no column {column!r} ({names})")
            if not _numeric(datasets, held[column]):
                raise ValueError(
                    f"data.params.features: column {column!r} holds {held[column]}, not numbers"
                )
        if not columns:
            raise ValueError("data.params.features: name at least one column")
        return "vectors", columns
    images = [name for name, feature in held.items() if isinstance(feature, datasets.Image)]
    if images:
        return "images", images[:1]
    skip = {label_column, by, INDEX}
    numeric = [
        name for name, feature in held.items() if name not in skip and _numeric(datasets, feature)
    ]
    if not numeric:
        raise ValueError(
            f"data.params.features: the dataset has no Image column and no numeric column "
            f"besides its label ({names}); name them (features or image_column)"
        )
    return "vectors", numeric


def _labels(datasets, parts, label_column: str, where: str):
    """(int64 class ids of every part's samples, the class names)."""
    feature = parts[0].features[label_column]
    values = [part.select_columns([label_column]).with_format("numpy")[:] for part in parts]
    labels = [np.asarray(value[label_column]) for value in values]
    if isinstance(feature, datasets.ClassLabel):
        for part in parts[1:]:
            if part.features[label_column] != feature:
                raise ValueError(
                    f"data.params.label_column: the splits of {where} label {label_column!r} "
                    "with different classes"
                )
        y = np.concatenate(labels).astype(np.int64)
        if (y < 0).any():
            raise ValueError(
                f"data.params.label_column: {int((y < 0).sum())} samples of {where} have no "
                f"label (-1 in {label_column!r})"
            )
        return y, tuple(feature.names)
    label = np.concatenate(labels)
    if label.dtype == object:
        if any(value is None for value in label.tolist()):
            raise ValueError(
                f"data.params.label_column: {label_column!r} of {where} has missing labels"
            )
        label = np.asarray(label.tolist())
    check_class_labels(label, label_column)
    classes, ids = np.unique(label, return_inverse=True)
    return ids.reshape(-1).astype(np.int64), tuple(str(name) for name in classes)


def _inputs(dataset, inputs: str, columns, size: int, grey: bool, where: str) -> np.ndarray:
    if inputs == "images":
        return _pixels(dataset, columns[0], size, grey, where)
    return _vectors(dataset, columns, where)


def _vectors(dataset, columns, where: str) -> np.ndarray:
    """(N, D) float32: the columns side by side (a list column gives its values)."""
    values = dataset.select_columns(columns).with_format("numpy")[:]
    blocks = []
    for column in columns:
        value = values[column]
        try:
            value = np.asarray(value.tolist() if value.dtype == object else value, np.float32)
        except (TypeError, ValueError):
            raise ValueError(
                f"data.params.features: column {column!r} of {where} holds lists of different "
                "lengths or missing values"
            ) from None
        blocks.append(value.reshape(len(value), -1))
    x = np.concatenate(blocks, axis=1)
    check_finite(x, "features", where)
    return x


def _pixels(dataset, column: str, size: int, grey: bool, where: str) -> np.ndarray:
    """(N, C, size, size) uint8: the column's images, resized, grey or RGB."""
    from PIL import Image

    pixels = np.empty((len(dataset), 1 if grey else 3, size, size), dtype=np.uint8)
    row = 0
    for batch in dataset.select_columns([column]).iter(batch_size=256):
        for image in batch[column]:
            if not isinstance(image, Image.Image):
                raise ValueError(
                    f"data.params.image_column: {column!r} of {where} holds "
                    f"{type(image).__name__}, not images (numeric columns: give features)"
                )
            image = image.convert("L" if grey else "RGB").resize((size, size), Image.BILINEAR)
            array = np.asarray(image, dtype=np.uint8)
            pixels[row] = array[None] if grey else array.transpose(2, 0, 1)
            row += 1
    return pixels
