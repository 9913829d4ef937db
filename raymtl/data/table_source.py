"""A source of data already split by client: a table with a client column (`table`). Its pools
are keyed by client (`Pool.keys`): the default partition `natural` gives the federation's
client k exactly the samples of the data's k-th client, the clients in the sorted order of
their ids.

    data: {name: table, params: {path: clients.parquet}}
        A Parquet (.parquet) or CSV (.csv) file, one row per sample: client_column (default
        "client": ints or strings) names each sample's client, label_column (default
        "label") its class (ids, strings, whole-number floats: classes are the sorted
        distinct values; fractional floats are refused). The features are the columns
        `features` lists, else every int or float column but the client, label, split and
        group columns: float32 vectors (N, 1, 1, D), scale 1. Or image_column names a
        column of encoded images (PNG/JPEG bytes, or Hugging Face's {"bytes", "path"}
        struct) or of image files (paths relative to the table's folder), each decoded to
        size x size, grey (1 channel) or RGB (3), uint8 (N, C, size, size), scale 255.
        split_column: "train" / "test" per row (anything else is refused), the clients'
        given test split; group_column: each client's task or group (one value per client;
        the groups are numbered in the sorted order of their values).

          data:
            name: table
            params: {path: clients.csv, client_column: writer, label_column: digit,
                     split_column: split, group_column: region}

        An .npz file instead: arrays x, y and client (one per sample), optionally x_test,
        y_test and client_test (the given test split) and group (and group_test): one value
        per sample, constant within a client. x takes the layouts of `arrays` ((N, H, W),
        (N, C, H, W), (N, H, W, C) or (N, D) vectors); uint8 pixels keep scale 255.

A relative `path` is looked up under `data.root` when it is set, else the current folder.
Every data check is a one-line ValueError naming the file, the field and the first bad
sample (or row): NaN or inf features, fractional labels, x, y and client of different
lengths, a client without samples, keys that disagree with the data, a missing file.

The keyed pool, the .npz reading and the labels' joining here serve the other keyed sources
too (client_folders.py, leaf_source.py).
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import torch

from raymtl.data.source_registry import ClientKeys, Pool, register_dataset
from raymtl.data.user_sources import (
    _images,
    _resolve,
    check_class_labels,
    check_finite,
    check_size,
    class_ids,
    image_pixels,
    sample_tensor,
)

TABLE_SUFFIXES = (".parquet", ".pq", ".csv", ".npz")
SPLITS = ("train", "test")


def _show(value: object) -> str:
    """A value as a message shows it (numpy scalars as their Python value)."""
    return repr(value.item() if isinstance(value, np.generic) else value)


def _columns_text(names) -> str:
    return ", ".join(names) if names else "none"


def _keyed_pool(
    x: np.ndarray,
    labels: np.ndarray,
    client: np.ndarray,
    names: tuple[str, ...],
    source: str,
    test: np.ndarray | None = None,
    group: np.ndarray | None = None,
    inputs: str = "images",
) -> Pool:
    """The Pool of samples keyed by client, classes the sorted distinct labels."""
    class_names, ids = class_ids(labels)
    tensor, scale = sample_tensor(x)
    if inputs == "vectors" and tensor.dtype != torch.float32:
        tensor, scale = tensor.float(), 1.0
    keys = ClientKeys(np.asarray(client, dtype=np.int64), names, test, group, source)
    y = torch.from_numpy(ids)
    return Pool(
        tensor,
        y,
        len(class_names),
        class_names,
        scale,
        source,
        _test_start(test),
        keys,
        inputs=inputs,
    )


def _test_start(test: np.ndarray | None) -> int | None:
    """The first test sample when the given test samples are the last ones (else None)."""
    if test is None or not test.any() or test.all():
        return None
    start = int(np.argmax(test))
    return start if test[start:].all() else None


def _client_ids(values: np.ndarray, field: str, file: Path, unit: str = "sample"):
    """The sorted distinct client ids (as strings) and each sample's client index."""
    if values.dtype.kind == "S":
        values = values.astype(str)
    if values.dtype.kind == "f":
        whole = np.isfinite(values) & (values == np.round(values))
        if not whole.all():
            first = int(np.flatnonzero(~whole)[0])
            raise ValueError(
                f"data.params.path: {field} of '{file}' holds {values[first]:g} at {unit} "
                f"{first}: client ids are ints or strings"
            )
        values = values.astype(np.int64)
    if values.dtype.kind not in "iubU":
        raise ValueError(
            f"data.params.path: {field} of '{file}' holds {values.dtype}, not client ids "
            "(ints or strings)"
        )
    clients, index = np.unique(values, return_inverse=True)
    return tuple(str(name) for name in clients), index.reshape(-1).astype(np.int64)


def _client_groups(
    client: np.ndarray,
    values: np.ndarray,
    names: tuple[str, ...],
    field: str,
    file: Path,
    param: str,
    unit: str = "sample",
) -> np.ndarray:
    """(K,) int64: each client's group, the index of its value among the sorted distinct
    values; a client with two values, or none, is refused."""
    kinds, ids = np.unique(values, return_inverse=True)
    ids = ids.reshape(-1)
    seen, first_at = np.unique(client, return_index=True)
    first = np.full(len(names), -1, dtype=np.int64)
    first[seen] = first_at
    if (first < 0).any():
        k = int(np.flatnonzero(first < 0)[0])
        raise ValueError(
            f"data.params.{param}: client {names[k]!r} of '{file}' has no value in {field} "
            "(its samples are all in the test split: give group_test)"
        )
    differs = np.flatnonzero(ids != ids[first[client]])
    if differs.size:
        i = int(differs[0])
        k = int(client[i])
        raise ValueError(
            f"data.params.{param}: client {names[k]!r} of '{file}' has {field} "
            f"{_show(kinds[ids[first[k]]])} at {unit} {first[k]} but {_show(kinds[ids[i]])} at "
            f"{unit} {i}; a client's group must be one value"
        )
    return ids[first].astype(np.int64)


def _same_lengths(file: Path, arrays: list[tuple[str, int]]) -> None:
    """Arrays that give one value per sample are as long as the first (x)."""
    (first, length), *others = arrays
    for name, other in others:
        if other != length:
            raise ValueError(
                f"data.params.path: {first} of '{file}' has {length} samples but {name} has "
                f"{other} (the first unmatched: sample {min(length, other)})"
            )
    if length == 0:
        raise ValueError(f"data.params.path: {first} of '{file}' holds no samples")


def _open_npz(file: Path):
    try:
        return np.load(file, allow_pickle=False)
    except (OSError, ValueError) as error:
        message = " ".join(str(error).split())
        raise ValueError(f"data.params.path: '{file}' is not an .npz file ({message})") from None


def _npz_split(arrays, file: Path, x_key: str, y_key: str, extra: tuple[str, ...] = ()):
    """x (N, C, H, W) and y (N,) of an .npz, checked, with its `extra` per-sample arrays."""
    for key in (x_key, y_key, *extra):
        if key not in arrays:
            needs = ", ".join((x_key, y_key, *extra))
            raise ValueError(f"data.params.path: '{file}' has no array {key!r} (it needs {needs})")
    raw = arrays[x_key]
    x = _images(raw, x_key, file)
    y = arrays[y_key].reshape(-1)
    more = [arrays[key].reshape(-1) for key in extra]
    lengths = [(x_key, len(x)), (y_key, len(y))]
    _same_lengths(file, lengths + [(key, len(a)) for key, a in zip(extra, more, strict=True)])
    check_finite(x, x_key, file)
    check_class_labels(y, y_key, file)
    return x, y, more, raw.ndim == 2


def _joined_labels(labels: list[np.ndarray]) -> np.ndarray:
    """One label array: numbers stay numbers; any strings make them all strings."""
    if all(y.dtype.kind in "iufb" for y in labels):
        return np.concatenate(labels)
    return np.concatenate([y.astype(str) for y in labels])


# --- table ------------------------------------------------------------------------------


@register_dataset("table", keyed=True)
def load_table(
    root: str | None = None,
    download: bool = False,
    path: str | None = None,
    client_column: str = "client",
    label_column: str = "label",
    features: list[str] | None = None,
    image_column: str | None = None,
    split_column: str | None = None,
    group_column: str | None = None,
    size: int = 32,
    grey: bool = False,
) -> Pool:
    """A table of samples with a client column: Parquet, CSV, or .npz (x, y, client)."""
    file = _resolve(path, root, "table")
    if not file.is_file():
        raise ValueError(
            f"data.params.path: '{file}' is not a file (a .parquet, .csv or .npz table of "
            "samples with a client column)"
        )
    suffix = file.suffix.lower()
    if suffix not in TABLE_SUFFIXES:
        raise ValueError(f"data.params.path: '{file}' is not a .parquet, .csv or .npz file")
    columns = {
        "client_column": (client_column, "client"),
        "label_column": (label_column, "label"),
        "features": (features, None),
        "image_column": (image_column, None),
        "split_column": (split_column, None),
        "group_column": (group_column, None),
    }
    if suffix == ".npz":
        for param, (value, default) in columns.items():
            if value != default:
                raise ValueError(
                    f"data.params.{param}: an .npz table has no columns (its arrays are x, y "
                    "and client; x_test, y_test and client_test; group)"
                )
        return _npz_table(file)
    for param, (value, _) in columns.items():
        if param != "features" and value is not None and not isinstance(value, str):
            raise ValueError(f"data.params.{param}: {value!r} is not a column name")
    if features is not None and image_column is not None:
        raise ValueError("data.params.features: give features or image_column, not both")
    check_size(size)
    return _columns_table(
        file,
        _read_table(file, suffix),
        client_column,
        label_column,
        features,
        image_column,
        split_column,
        group_column,
        size,
        grey,
    )


def _read_table(file: Path, suffix: str):
    import pyarrow as pa  # only tables need it

    kind = "CSV" if suffix == ".csv" else "Parquet"
    try:
        if suffix == ".csv":
            import pyarrow.csv as csv

            return csv.read_csv(file)
        import pyarrow.parquet as parquet

        return parquet.read_table(file)
    except (OSError, pa.ArrowException) as error:
        message = " ".join(str(error).split())
        raise ValueError(f"data.params.path: '{file}' is not a {kind} file ({message})") from None


def _column(table, param: str, name: str, file: Path):
    """Column `name` (data.params.<param> names it), with no empty cell."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if name not in table.column_names:
        raise ValueError(
            f"data.params.{param}: '{file}' has no column {name!r} (its columns: "
            f"{_columns_text(table.column_names)})"
        )
    column = table.column(name)
    if column.null_count:
        row = int(np.flatnonzero(pc.is_null(column).to_numpy(zero_copy_only=False))[0])
        raise ValueError(
            f"data.params.path: column {name!r} of '{file}' has no value at row {row} "
            f"({column.null_count} empty cells)"
        )
    if pa.types.is_dictionary(column.type):  # a categorical column: its values
        column = column.cast(column.type.value_type)
    return column


def _discrete(column, param: str, name: str, file: Path) -> np.ndarray:
    """A column of ids or labels as a numpy array (strings as str, not objects)."""
    import pyarrow as pa

    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return np.asarray(column.to_pylist(), dtype=str)
    numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
    if not (numeric or pa.types.is_boolean(kind)):
        raise ValueError(
            f"data.params.{param}: column {name!r} of '{file}' holds {kind}, not ids or labels "
            "(ints or strings)"
        )
    return column.to_numpy()


def _numeric(kind, booleans: bool = False) -> bool:
    import pyarrow as pa

    numbers = pa.types.is_integer(kind) or pa.types.is_floating(kind)
    return numbers or (booleans and pa.types.is_boolean(kind))


def _columns_table(
    file,
    table,
    client_column,
    label_column,
    features,
    image_column,
    split_column,
    group_column,
    size,
    grey,
) -> Pool:
    if table.num_rows == 0:
        raise ValueError(f"data.params.path: '{file}' holds no rows")
    client_values = _discrete(
        _column(table, "client_column", client_column, file), "client_column", client_column, file
    )
    names, client = _client_ids(client_values, f"column {client_column!r}", file, "row")
    labels = _discrete(
        _column(table, "label_column", label_column, file), "label_column", label_column, file
    )
    check_class_labels(labels, f"column {label_column!r}", file)
    test = None
    if split_column is not None:
        split = _discrete(
            _column(table, "split_column", split_column, file), "split_column", split_column, file
        ).astype(str)
        wrong = np.flatnonzero(~np.isin(split, SPLITS))
        if wrong.size:
            raise ValueError(
                f"data.params.split_column: column {split_column!r} of '{file}' holds "
                f"{_show(split[wrong[0]])} at row {wrong[0]}; its values must be train or test"
            )
        test = split == "test"
    group = None
    if group_column is not None:
        values = _discrete(
            _column(table, "group_column", group_column, file), "group_column", group_column, file
        )
        field = f"column {group_column!r}"
        group = _client_groups(client, values, names, field, file, "group_column", "row")
    if image_column is not None:
        x = _image_column(table, image_column, file, size, grey)
        inputs = "images"
    else:
        keys = (client_column, label_column, split_column, group_column)
        x = _feature_columns(table, features, {k for k in keys if k is not None}, file)
        inputs = "vectors"
    return _keyed_pool(x, labels, client, names, str(file), test, group, inputs)


def _feature_columns(table, features, reserved: set[str], file: Path) -> np.ndarray:
    """(N, 1, 1, D) float32 of the feature columns, each checked finite."""
    schema = table.schema
    if features is None:
        chosen = [
            name
            for name in table.column_names
            if name not in reserved and _numeric(schema.field(name).type)
        ]
        if not chosen:
            raise ValueError(
                f"data.params.features: '{file}' has no int or float column besides the client, "
                f"label, split and group columns (its columns: {_columns_text(table.column_names)})"
            )
    else:
        if isinstance(features, str) or not isinstance(features, list | tuple) or not features:
            raise ValueError(f"data.params.features: {features!r} is not a list of column names")
        chosen = list(features)
        for name in chosen:
            if not isinstance(name, str):
                raise ValueError(f"data.params.features: {name!r} is not a column name")
            if name in reserved:
                raise ValueError(
                    f"data.params.features: {name!r} is the client, label, split or group "
                    "column, not a feature"
                )
            if name not in table.column_names:
                raise ValueError(
                    f"data.params.features: '{file}' has no column {name!r} (its columns: "
                    f"{_columns_text(table.column_names)})"
                )
            kind = schema.field(name).type
            if not _numeric(kind, booleans=True):
                raise ValueError(
                    f"data.params.features: column {name!r} of '{file}' holds {kind}, not numbers"
                )
    vectors = np.empty((table.num_rows, len(chosen)), dtype=np.float32)
    for j, name in enumerate(chosen):
        column = _column(table, "features", name, file)
        vectors[:, j] = column.to_numpy().astype(np.float32)
        check_finite(vectors[:, j], f"column {name!r}", file)
    return vectors[:, None, None, :]


def _image_column(table, name: str, file: Path, size: int, grey: bool) -> np.ndarray:
    """(N, C, size, size) uint8: a column of encoded images or of image file paths."""
    images = []
    for row, value in enumerate(_column(table, "image_column", name, file).to_pylist()):
        source = value
        if isinstance(value, dict):  # Hugging Face's Image feature: {"bytes", "path"}
            source = value.get("bytes") or value.get("path")
        where = f"row {row} of column {name!r} of '{file}'"
        if isinstance(source, bytes | bytearray | memoryview):
            source = io.BytesIO(bytes(source))
        elif isinstance(source, str):
            image_file = file.parent / Path(source).expanduser()
            if not image_file.is_file():
                raise ValueError(
                    f"data.params.image_column: {where} names '{image_file}', which is not a file"
                )
            source = image_file
        else:
            raise ValueError(
                f"data.params.image_column: {where} holds {type(value).__name__}, not an image "
                "(encoded bytes, a {'bytes', 'path'} struct or a file path)"
            )
        try:
            images.append(image_pixels(source, size, grey))
        except (OSError, ValueError) as error:
            message = " ".join(str(error).split())
            raise ValueError(
                f"data.params.image_column: {where} is not an image ({message})"
            ) from None
    return np.stack(images)


def _npz_table(file: Path) -> Pool:
    arrays = _open_npz(file)
    has_test = "x_test" in arrays
    for key in ("y_test", "client_test", "group_test"):
        if key in arrays and not has_test:
            raise ValueError(f"data.params.path: '{file}' has {key!r} but no 'x_test'")
    parts = []
    for x_key, y_key, c_key in (("x", "y", "client"), ("x_test", "y_test", "client_test")):
        if x_key == "x_test" and not has_test:
            continue
        x, y, (client,), vectors = _npz_split(arrays, file, x_key, y_key, (c_key,))
        parts.append((x, y, client, vectors))
    if len(parts) > 1 and parts[0][0].shape[1:] != parts[1][0].shape[1:]:
        raise ValueError(
            f"data.params.path: x and x_test of '{file}' differ in sample shape "
            f"({parts[0][0].shape[1:]} and {parts[1][0].shape[1:]})"
        )
    sizes = [len(x) for x, *_ in parts]
    x = np.concatenate([x for x, *_ in parts])
    labels = _joined_labels([y for _, y, *_ in parts])
    client_values = np.concatenate([c for _, _, c, _ in parts])
    field = "client" if len(parts) == 1 else "client / client_test"
    names, client = _client_ids(client_values, field, file)
    test = np.repeat([False, True], sizes) if len(parts) > 1 else None
    group = None
    if "group" in arrays:
        values = [arrays["group"].reshape(-1)]
        _same_lengths(file, [("x", sizes[0]), ("group", len(values[0]))])
        if has_test and "group_test" in arrays:
            values.append(arrays["group_test"].reshape(-1))
            _same_lengths(file, [("x_test", sizes[1]), ("group_test", len(values[1]))])
        given = sum(len(v) for v in values)
        group = _client_groups(client[:given], np.concatenate(values), names, "group", file, "path")
    inputs = "vectors" if parts[0][3] else "images"
    return _keyed_pool(x, labels, client, names, str(file), test, group, inputs)
