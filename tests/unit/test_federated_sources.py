"""Keyed sources (table, client_folders, leaf) load tiny files in each format: every client
holds exactly its own samples, through load_pool and through the natural partition."""

import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch

from raymtl.data.natural import natural
from raymtl.data.source_registry import SOURCES, is_keyed, load_pool
from raymtl.data.text import ALL_LETTERS, CHARACTER_NAMES, decode_characters, encode_characters


def client_rows(pool) -> dict[str, list[int]]:
    """Each client's sample indices, as the pool's keys say."""
    client = np.asarray(pool.keys.client)
    return {name: np.flatnonzero(client == k).tolist() for k, name in enumerate(pool.keys.names)}


def assert_natural(pool, rows: dict[str, list[int]], test_rows: dict[str, list[int]] | None):
    """Shard k holds exactly client k's rows: split by test_fraction, or as the data gives."""
    names = list(pool.keys.names)
    assert names == sorted(rows, key=names.index) and len(names) == len(rows)
    shards = natural(pool, len(names), seed=0, test_fraction=0.25)
    assert len(shards) == len(names)
    for k, (name, shard) in enumerate(zip(names, shards, strict=True)):
        train, test = shard.train_idx.tolist(), shard.test_idx.tolist()
        assert shard.key == k and not set(train) & set(test)
        assert sorted(train + test) == rows[name]
        if test_rows is not None:
            assert test == test_rows[name]
            assert train == [i for i in rows[name] if i not in test_rows[name]]


def rows_of(values, name) -> list[int]:
    return [i for i, value in enumerate(values) if value == name]


# --- table --------------------------------------------------------------------------------

CLIENTS = ["c", "a", "b", "a", "c", "b"] * 3  # 18 rows, 6 per client, interleaved
LABELS = ["cat", "dog", "cat", "emu", "dog", "emu"] * 3


def feature_table() -> dict[str, list]:
    f0 = [float(i) for i in range(18)]
    f1 = [float(i) / 2 - 3 for i in range(18)]
    return {"client": CLIENTS, "f0": f0, "note": ["x"] * 18, "label": LABELS, "f1": f1}


def test_keyed_sources_are_registered():
    assert {"table", "client_folders", "leaf"} <= set(SOURCES)
    assert all(is_keyed(name) for name in ("table", "client_folders", "leaf"))


def test_table_from_parquet(tmp_path):
    pq.write_table(pa.table(feature_table()), tmp_path / "clients.parquet")
    pool = load_pool("table", root=str(tmp_path), path="clients.parquet")
    assert pool.keys.names == ("a", "b", "c") and pool.num_keyed_clients == 3
    assert pool.inputs == "vectors" and pool.x.shape == (18, 1, 1, 2)
    assert pool.x.dtype == torch.float32 and pool.scale == 1.0
    assert pool.x[5, 0, 0].tolist() == [5.0, -0.5]  # the numeric columns f0, f1; not note
    assert pool.class_names == ("cat", "dog", "emu")
    assert [pool.class_names[i] for i in pool.y.tolist()] == LABELS
    rows = {name: rows_of(CLIENTS, name) for name in "abc"}
    assert client_rows(pool) == rows
    assert pool.keys.test is None and pool.keys.group is None and pool.test_start is None
    assert pool.source == str(tmp_path / "clients.parquet")
    assert_natural(pool, rows, None)


def test_table_from_csv_with_split_and_group(tmp_path):
    clients = [10, 2, 7, 2, 10, 7] * 3
    split = ["train", "test", "test", "train", "test", "train"] * 3
    region = {10: "north", 2: "south", 7: "north"}
    table = {
        "writer": clients,
        "digit": [i % 3 for i in range(18)],
        "split": split,
        "region": [region[c] for c in clients],
        "f0": [float(i) for i in range(18)],
        "f1": list(range(18)),
    }
    pacsv.write_csv(pa.table(table), tmp_path / "clients.csv")
    pool = load_pool(
        "table",
        path=str(tmp_path / "clients.csv"),
        client_column="writer",
        label_column="digit",
        split_column="split",
        group_column="region",
        features=["f1"],
    )
    assert pool.keys.names == ("2", "7", "10")  # sorted as numbers
    assert pool.x.shape == (18, 1, 1, 1) and pool.x[4, 0, 0, 0].item() == 4.0
    assert pool.class_names == ("0", "1", "2") and pool.y.tolist() == table["digit"]
    assert pool.keys.group.tolist() == [1, 0, 0]  # south, north, north
    rows = {str(c): rows_of(clients, c) for c in (2, 7, 10)}
    tests = {name: [i for i in rows[name] if split[i] == "test"] for name in rows}
    assert client_rows(pool) == rows and pool.keys.test.tolist() == [s == "test" for s in split]
    assert_natural(pool, rows, tests)
    shards = natural(pool, 3, seed=0)
    assert [shard.task for shard in shards] == [1, 0, 0]
    assert [shard.group for shard in shards] == [1, 0, 0]


def test_table_from_npz_with_a_test_split_and_groups(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(9, 6, 6), dtype=np.uint8)
    client = np.array([3, 1, 3, 2, 1, 2, 3, 1, 2])
    x_test = rng.integers(0, 256, size=(3, 6, 6), dtype=np.uint8)
    client_test = np.array([2, 3, 1])
    group = np.array([{1: "b", 2: "a", 3: "b"}[c] for c in client])
    np.savez(
        tmp_path / "keyed.npz",
        x=x,
        y=np.arange(9) % 2,
        client=client,
        x_test=x_test,
        y_test=np.array([0, 1, 1]),
        client_test=client_test,
        group=group,
    )
    pool = load_pool("table", path=str(tmp_path / "keyed.npz"))
    assert pool.keys.names == ("1", "2", "3") and pool.inputs == "images"
    assert pool.x.shape == (12, 1, 6, 6) and pool.x.dtype == torch.uint8 and pool.scale == 255.0
    assert torch.equal(pool.x[9, 0], torch.from_numpy(x_test[0]))
    assert pool.test_start == 9 and pool.keys.test.tolist() == [False] * 9 + [True] * 3
    assert pool.keys.group.tolist() == [1, 0, 1]
    every = np.concatenate([client, client_test])
    rows = {str(c): rows_of(every, c) for c in (1, 2, 3)}
    assert client_rows(pool) == rows
    tests = {str(c): [9 + i for i in rows_of(client_test, c)] for c in (1, 2, 3)}
    assert_natural(pool, rows, tests)


def png_bytes(colour, side=5) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", (side, side), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def test_table_of_encoded_images_and_of_image_paths(tmp_path):
    colours = [(255, 0, 0), (0, 0, 255)] * 4
    clients = ["u", "v"] * 2 + ["v", "u"] * 2
    images = [{"bytes": png_bytes(c), "path": None} for c in colours]  # Hugging Face's struct
    table = {"image": images, "label": [c[0] for c in colours], "client": clients}
    pq.write_table(pa.table(table), tmp_path / "hf.parquet")
    pool = load_pool("table", path=str(tmp_path / "hf.parquet"), image_column="image", size=4)
    assert pool.inputs == "images" and pool.x.shape == (8, 3, 4, 4) and pool.scale == 255.0
    assert pool.x[0, :, 0, 0].tolist() == [255, 0, 0] and pool.x[1, :, 0, 0].tolist() == [0, 0, 255]
    assert pool.class_names == ("0", "255") and pool.y.tolist() == [1, 0] * 4
    rows = {name: rows_of(clients, name) for name in "uv"}
    assert client_rows(pool) == rows
    assert_natural(pool, rows, None)

    raw = {"image": [png_bytes(c) for c in colours], "label": table["label"], "client": clients}
    pq.write_table(pa.table(raw), tmp_path / "raw.parquet")
    grey = load_pool(
        "table", path=str(tmp_path / "raw.parquet"), image_column="image", size=3, grey=True
    )
    assert grey.x.shape == (8, 1, 3, 3) and grey.x[0, 0, 0, 0].item() == 76  # 0.299 * 255

    (tmp_path / "pics").mkdir()
    for i, colour in enumerate(colours):
        (tmp_path / "pics" / f"{i}.png").write_bytes(png_bytes(colour))
    paths = {"file": [f"pics/{i}.png" for i in range(8)], "label": table["label"]}
    pacsv.write_csv(pa.table({**paths, "client": clients}), tmp_path / "paths.csv")
    from_paths = load_pool("table", path=str(tmp_path / "paths.csv"), image_column="file", size=4)
    assert torch.equal(from_paths.x, pool.x) and client_rows(from_paths) == rows


# --- client folders -----------------------------------------------------------------------


def write_class_images(folder, counts: dict[str, int], colour) -> None:
    from PIL import Image

    for label, count in counts.items():
        (folder / label).mkdir(parents=True)
        for i in range(count):
            Image.new("RGB", (7, 7), colour).save(folder / label / f"{i}.png")


def test_client_folders_of_images(tmp_path):
    write_class_images(tmp_path / "bob", {"cat": 2, "dog": 3}, (255, 0, 0))
    write_class_images(tmp_path / "amy", {"dog": 2, "emu": 2}, (0, 255, 0))
    (tmp_path / ".hidden").mkdir()
    (tmp_path / "README.txt").write_text("not a client")
    pool = load_pool("client_folders", path=str(tmp_path), size=4)
    assert pool.keys.names == ("amy", "bob") and pool.inputs == "images"
    assert pool.x.shape == (9, 3, 4, 4) and pool.x.dtype == torch.uint8
    assert pool.class_names == ("cat", "dog", "emu")
    assert pool.y.tolist() == [1, 1, 2, 2, 0, 0, 1, 1, 1]
    assert pool.x[0, :, 0, 0].tolist() == [0, 255, 0] and pool.x[4, :, 0, 0].tolist() == [255, 0, 0]
    rows = {"amy": [0, 1, 2, 3], "bob": [4, 5, 6, 7, 8]}
    assert client_rows(pool) == rows and pool.keys.test is None
    assert_natural(pool, rows, None)


def test_client_folders_with_given_test_splits_and_npz_clients(tmp_path):
    write_class_images(tmp_path / "images" / "p" / "train", {"0": 2, "1": 2}, (9, 9, 9))
    write_class_images(tmp_path / "images" / "p" / "test", {"1": 1}, (9, 9, 9))
    write_class_images(tmp_path / "images" / "q" / "train", {"1": 3}, (99, 99, 99))
    write_class_images(tmp_path / "images" / "q" / "test", {"0": 1, "1": 1}, (99, 99, 99))
    pool = load_pool("client_folders", path=str(tmp_path / "images"), size=2, grey=True)
    assert pool.x.shape == (10, 1, 2, 2) and pool.keys.names == ("p", "q")
    rows = {"p": [0, 1, 2, 3, 4], "q": [5, 6, 7, 8, 9]}
    tests = {"p": [4], "q": [8, 9]}
    assert client_rows(pool) == rows and pool.y.tolist() == [0, 0, 1, 1, 1, 1, 1, 1, 0, 1]
    assert_natural(pool, rows, tests)

    arrays = tmp_path / "arrays"
    for name, offset in (("z", 0.0), ("w", 10.0)):
        (arrays / name).mkdir(parents=True)
        x = np.arange(5 * 3, dtype=np.float64).reshape(5, 3) + offset
        np.savez(arrays / name / "data.npz", x=x, y=np.arange(5) % 2 + int(offset))
    vectors = load_pool("client_folders", path=str(arrays))
    assert vectors.keys.names == ("w", "z") and vectors.inputs == "vectors"
    assert vectors.x.shape == (10, 1, 1, 3) and vectors.x.dtype == torch.float32
    assert vectors.x[0, 0, 0, 0].item() == 10.0 and vectors.class_names == ("0", "1", "10", "11")
    rows = {"w": [0, 1, 2, 3, 4], "z": [5, 6, 7, 8, 9]}
    assert client_rows(vectors) == rows
    assert_natural(vectors, rows, None)


# --- LEAF ---------------------------------------------------------------------------------


def leaf_file(path, user_data: dict[str, tuple[list, list]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {
        "users": list(user_data),
        "num_samples": [len(x) for x, _ in user_data.values()],
        "user_data": {user: {"x": x, "y": y} for user, (x, y) in user_data.items()},
        "hierarchies": ["ignored"] * len(user_data),
    }
    path.write_text(json.dumps(data))


def femnist_samples(rng, n: int, labels: list[int]):
    images = rng.random((n, 784)).round(3)
    return images.tolist(), labels[:n]


def test_leaf_femnist(tmp_path):
    rng = np.random.default_rng(0)
    data = tmp_path / "femnist" / "data"
    train = {
        "f0003_11": femnist_samples(rng, 4, [0, 1, 61, 5]),
        "f0001_40": femnist_samples(rng, 3, [9, 9, 2]),
        "f0002_07": femnist_samples(rng, 5, [3, 4, 4, 3, 10]),
    }
    leaf_file(data / "train" / "all_data_0_niid_train.json", dict(list(train.items())[:2]))
    leaf_file(data / "train" / "all_data_1_niid_train.json", dict(list(train.items())[2:]))
    test = {user: femnist_samples(rng, 1, [7]) for user in train}
    leaf_file(data / "test" / "all_data_0_niid_test.json", test)
    pool = load_pool("leaf", path=str(data))
    assert pool.keys.names == ("f0001_40", "f0002_07", "f0003_11") and pool.inputs == "images"
    assert pool.x.shape == (15, 1, 28, 28) and pool.x.dtype == torch.float32
    assert pool.scale == 1.0 and pool.num_classes == 62 and pool.class_names[61] == "61"
    order = ["f0001_40", "f0002_07", "f0003_11"]
    expected_y = [y for user in order for y in train[user][1]] + [7, 7, 7]
    assert pool.y.tolist() == expected_y
    first = np.asarray(train["f0001_40"][0][0], dtype=np.float32).reshape(28, 28)
    assert torch.equal(pool.x[0, 0], torch.from_numpy(first))
    rows = {"f0001_40": [0, 1, 2, 12], "f0002_07": [3, 4, 5, 6, 7, 13]}
    rows["f0003_11"] = [8, 9, 10, 11, 14]
    tests = {user: rows[user][-1:] for user in rows}
    assert client_rows(pool) == rows and pool.test_start == 12
    assert_natural(pool, rows, tests)

    two = load_pool("leaf", path=str(data), max_users=2)
    assert two.keys.names == ("f0001_40", "f0002_07") and len(two.y) == 10
    assert two.num_classes == 11  # its labels run to 10
    assert client_rows(two) == {"f0001_40": [0, 1, 2, 8], "f0002_07": [3, 4, 5, 6, 7, 9]}


def test_leaf_synthetic_vectors_without_a_test_split(tmp_path):
    rng = np.random.default_rng(1)
    users = {f"{u:05d}": (rng.normal(size=(4, 60)).tolist(), [u, 0, u, 1]) for u in range(3)}
    leaf_file(tmp_path / "synthetic" / "train" / "data.json", users)
    pool = load_pool("leaf", root=str(tmp_path), path="synthetic")
    assert pool.inputs == "vectors" and pool.x.shape == (12, 1, 1, 60) and pool.num_classes == 3
    assert pool.keys.test is None and pool.test_start is None
    rows = {f"{u:05d}": list(range(4 * u, 4 * u + 4)) for u in range(3)}
    assert client_rows(pool) == rows
    assert_natural(pool, rows, None)


SPEECH = (
    "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer "
    "The slings and arrows of outrageous fortune, Or to take arms against a sea of troubles"
)


def windows(text: str, count: int, start: int):
    xs = [text[start + i : start + i + 80] for i in range(count)]
    return xs, [text[start + i + 80] for i in range(count)]


def test_leaf_shakespeare(tmp_path):
    data = tmp_path / "shakespeare" / "data"
    train = {"THE_TRAGEDY_OF_HAMLET_HAMLET": windows(SPEECH, 5, 0)}
    train["ALLS_WELL_THAT_ENDS_WELL_KING"] = windows(SPEECH, 4, 40)
    leaf_file(data / "train" / "train.json", train)
    test = {"THE_TRAGEDY_OF_HAMLET_HAMLET": windows(SPEECH, 2, 60)}
    test["ALLS_WELL_THAT_ENDS_WELL_KING"] = windows(SPEECH, 1, 70)
    leaf_file(data / "test" / "test.json", test)
    pool = load_pool("leaf", path=str(data))
    names = ("ALLS_WELL_THAT_ENDS_WELL_KING", "THE_TRAGEDY_OF_HAMLET_HAMLET")
    assert pool.keys.names == names
    assert pool.inputs == "tokens" and pool.vocabulary == 80 and pool.num_classes == 80
    assert pool.x.shape == (12, 1, 1, 80) and pool.x.dtype == torch.uint8 and pool.scale == 1.0
    assert pool.class_names == CHARACTER_NAMES and pool.class_names[0] == "\\n"
    assert decode_characters(pool.x[0, 0, 0]) == SPEECH[40:120]
    assert decode_characters(pool.x[4, 0, 0]) == SPEECH[0:80]
    assert ALL_LETTERS[pool.y[4].item()] == SPEECH[80]
    rows = {names[0]: [0, 1, 2, 3, 9], names[1]: [4, 5, 6, 7, 8, 10, 11]}
    tests = {names[0]: [9], names[1]: [10, 11]}
    assert client_rows(pool) == rows and pool.test_start == 9
    assert_natural(pool, rows, tests)


def test_text_helpers():
    assert len(ALL_LETTERS) == 80 and ALL_LETTERS[0] == "\n"
    ids = encode_characters("To be")
    assert ids.dtype == np.uint8 and ids.tolist() == [44, 67, 1, 54, 57]
    assert decode_characters(ids) == "To be"
    with pytest.raises(ValueError, match=r"^character 'é' at position 1 is not in LEAF's"):
        encode_characters("né")


# --- bad data: one line naming the file, the field and the first bad index ----------------


def write_parquet(path, **changes) -> str:
    table = {**feature_table(), **changes}
    pq.write_table(pa.table(table), path)
    return str(path)


def bad_table(tmp_path, name):
    f1 = [float(i) for i in range(18)]
    f1[4] = float("nan")
    f1[9] = float("inf")
    labels = [float(i % 3) for i in range(18)]
    labels[7] = 0.5
    split = ["train"] * 18
    split[5] = "valid"
    group = ["g"] * 18
    group[7] = "h"  # row 7 is client a's, whose first row (1) says g
    cases = {
        "nan": (
            {"f1": f1},
            {},
            "data.params.path: column 'f1' of '{file}' holds NaN or inf in "
            "2 of 18 samples (the first: sample 4)",
        ),
        "fraction": (
            {"label": labels},
            {},
            "data.params.path: column 'label' of '{file}' holds "
            "1 labels that are not class ids (0.5, ...), the first at sample 7",
        ),
        "no column": (
            {},
            {"client_column": "writer"},
            "data.params.client_column: '{file}' has "
            "no column 'writer' (its columns: client, f0, note, label, f1)",
        ),
        "split": (
            {"split": split},
            {"split_column": "split"},
            "data.params.split_column: "
            "column 'split' of '{file}' holds 'valid' at row 5; its values must be train",
        ),
        "group": (
            {"group": group},
            {"group_column": "group"},
            "data.params.group_column: "
            "client 'a' of '{file}' has column 'group' 'g' at row 1 but 'h' at row 7",
        ),
        "empty cell": (
            {"label": [None] * 3 + LABELS[3:]},
            {},
            "data.params.path: column 'label' of '{file}' has no value at row 0 (3 empty cells)",
        ),
        "feature": (
            {},
            {"features": ["f0", "note"]},
            "data.params.features: column 'note' of '{file}' holds string, not numbers",
        ),
    }
    return cases[name]


@pytest.mark.parametrize(
    "case", ["nan", "fraction", "no column", "split", "group", "empty cell", "feature"]
)
def test_bad_tables_are_one_line(tmp_path, case):
    changes, params, problem = bad_table(tmp_path, case)
    file = write_parquet(tmp_path / "bad.parquet", **changes)
    with pytest.raises(ValueError) as error:
        load_pool("table", path=file, **params)
    message = str(error.value)
    assert "\n" not in message and message.startswith(problem.format(file=file)), message


@pytest.mark.parametrize(
    ("arrays", "problem"),
    [
        (
            {"x": np.zeros((4, 2)), "y": np.zeros(3), "client": np.zeros(4)},
            "data.params.path: x of '{file}' has 4 samples but y has 3 (the first unmatched: "
            "sample 3)",
        ),
        (
            {"x": np.zeros((4, 2)), "y": np.zeros(4), "client": np.zeros(5)},
            "data.params.path: x of '{file}' has 4 samples but client has 5 (the first "
            "unmatched: sample 4)",
        ),
        (
            {"x": np.array([[0.0], [1.0], [np.nan]]), "y": np.zeros(3), "client": np.zeros(3)},
            "data.params.path: x of '{file}' holds NaN or inf in 1 of 3 samples (the first: "
            "sample 2)",
        ),
        (
            {"x": np.zeros((3, 1)), "y": np.array([0, 1.5, 2]), "client": np.zeros(3)},
            "data.params.path: y of '{file}' holds 1 labels that are not class ids (1.5, ...), "
            "the first at sample 1",
        ),
        (
            {"x": np.zeros((3, 1)), "y": np.zeros(3), "client": np.array([1, 2, 2.5])},
            "data.params.path: client of '{file}' holds 2.5 at sample 2",
        ),
        (
            {"x": np.zeros((3, 1)), "y": np.zeros(3)},
            "data.params.path: '{file}' has no array 'client'",
        ),
        (
            {"x": np.zeros((4, 1)), "y": np.zeros(4), "client": np.array([0, 1, 0, 1])}
            | {"group": np.array([5, 6, 7, 6])},
            "data.params.path: client '0' of '{file}' has group 5 at sample 0 but 7 at sample 2",
        ),
    ],
)
def test_bad_npz_tables_are_one_line(tmp_path, arrays, problem):
    file = tmp_path / "bad.npz"
    np.savez(file, **arrays)
    with pytest.raises(ValueError) as error:
        load_pool("table", path=str(file))
    message = str(error.value)
    assert "\n" not in message and message.startswith(problem.format(file=file)), message


def test_missing_files_and_paths(tmp_path):
    for name in ("table", "client_folders", "leaf"):
        with pytest.raises(ValueError, match=f"^data.params.path: required by source '{name}'$"):
            load_pool(name)
    missing = tmp_path / "absent.parquet"
    with pytest.raises(ValueError, match=f"^data.params.path: '{missing}' is not a file"):
        load_pool("table", path=str(missing))
    with pytest.raises(ValueError, match=f"^data.params.path: '{tmp_path / 'gone'}' is not a "):
        load_pool("client_folders", path=str(tmp_path / "gone"))
    with pytest.raises(ValueError, match=f"^data.params.path: '{tmp_path / 'train'}' is not a "):
        load_pool("leaf", path=str(tmp_path))
    (tmp_path / "clients").mkdir()
    pacsv.write_csv(
        pa.table({"file": ["pics/absent.png"], "label": [0], "client": ["a"]}),
        tmp_path / "clients" / "t.csv",
    )
    with pytest.raises(ValueError) as error:
        load_pool("table", path=str(tmp_path / "clients" / "t.csv"), image_column="file")
    assert str(error.value) == (
        f"data.params.image_column: row 0 of column 'file' of '{tmp_path / 'clients' / 't.csv'}'"
        f" names '{tmp_path / 'clients' / 'pics' / 'absent.png'}', which is not a file"
    )


def test_bad_client_folders_are_one_line(tmp_path):
    write_class_images(tmp_path / "one" / "a", {"cat": 2}, (1, 2, 3))
    (tmp_path / "one" / "b").mkdir()
    with pytest.raises(ValueError) as error:
        load_pool("client_folders", path=str(tmp_path / "one"))
    assert str(error.value).startswith(
        f"data.params.path: client folder '{tmp_path / 'one' / 'b'}' holds no samples"
    )

    (tmp_path / "two" / "a").mkdir(parents=True)
    (tmp_path / "two" / "b").mkdir(parents=True)
    np.savez(tmp_path / "two" / "a" / "a.npz", x=np.zeros((3, 2)), y=np.zeros(3))
    np.savez(tmp_path / "two" / "b" / "b.npz", x=np.zeros((3, 2)), y=np.zeros(2))
    with pytest.raises(ValueError) as error:
        load_pool("client_folders", path=str(tmp_path / "two"))
    assert str(error.value).startswith(
        f"data.params.path: x of '{tmp_path / 'two' / 'b' / 'b.npz'}' has 3 samples but y has 2 "
        "(the first unmatched: sample 2)"
    )

    (tmp_path / "three" / "a").mkdir(parents=True)
    x = np.zeros((3, 2))
    x[1, 0] = np.inf
    np.savez(tmp_path / "three" / "a" / "a.npz", x=x, y=np.zeros(3))
    with pytest.raises(ValueError) as error:
        load_pool("client_folders", path=str(tmp_path / "three"))
    assert str(error.value).startswith(
        f"data.params.path: x of '{tmp_path / 'three' / 'a' / 'a.npz'}' holds NaN or inf in 1 "
        "of 3 samples (the first: sample 1)"
    )


def leaf_case(name: str) -> tuple[dict, str]:
    """A LEAF file that is wrong in one way, and the start of the error it gets."""
    good = {"x": [[0.1, 0.2, 0.3, 0.4]] * 3, "y": [0, 1, 0]}
    data = {"users": ["u1", "u2"], "num_samples": [3, 3], "user_data": {"u1": good, "u2": good}}
    problem = {
        "users": "data.params.path: users[1] 'u2' of '{file}' has no entry in user_data",
        "extra user": "data.params.path: user_data of '{file}' holds user 'u3', which users "
        "does not list",
        "num_samples": "data.params.path: num_samples[1] of '{file}' is 4 but "
        "user_data['u2'] holds 3 samples",
        "no samples": "data.params.path: users[1] 'u2' of '{file}' holds no samples "
        "(num_samples[1] 0, 0 in user_data)",
        "x vs y": "data.params.path: user_data['u2']['x'] of '{file}' has 3 samples but ['y'] 2 "
        "(the first unmatched: sample 2)",
        "nan": "data.params.path: user_data['u2']['x'] of '{file}' holds NaN or inf in 1 of 3 "
        "samples (the first: sample 1)",
        "fraction": "data.params.path: user_data['u2']['y'] of '{file}' holds 1 labels that are "
        "not class ids (0.5, ...), the first at sample 2",
        "width": "data.params.path: user_data['u2']['x'][2] of '{file}' has length 3; every "
        "sample must have the 4 numbers",
        "sent140": "data.params.path: user_data['u1']['x'][0] of '{file}' is a list of strings "
        "(LEAF's Sent140",
    }[name]
    if name == "users":
        del data["user_data"]["u2"]
    elif name == "extra user":
        data["user_data"]["u3"] = good
    elif name == "num_samples":
        data["num_samples"] = [3, 4]
    elif name == "no samples":
        data["num_samples"] = [3, 0]
        data["user_data"]["u2"] = {"x": [], "y": []}
    elif name == "x vs y":
        data["user_data"]["u2"] = {"x": good["x"], "y": [0, 1]}
    elif name == "nan":
        data["user_data"]["u2"] = {"x": [good["x"][0], [float("nan")] * 4, good["x"][0]]}
        data["user_data"]["u2"]["y"] = [0, 0, 0]
    elif name == "fraction":
        data["user_data"]["u2"] = {"x": good["x"], "y": [0, 1, 0.5]}
    elif name == "width":
        data["user_data"]["u2"] = {"x": good["x"][:2] + [[0.1, 0.2, 0.3]], "y": [0, 0, 0]}
    elif name == "sent140":
        sample = ["1467810369", "Mon Apr 06", "NO_QUERY", "user", "text"]
        data["user_data"] = {user: {"x": [sample] * 3, "y": [0, 1, 0]} for user in ("u1", "u2")}
    return data, problem


LEAF_CASES = [
    "users",
    "extra user",
    "num_samples",
    "no samples",
    "x vs y",
    "nan",
    "fraction",
    "width",
    "sent140",
]


@pytest.mark.parametrize("case", LEAF_CASES)
def test_bad_leaf_files_are_one_line(tmp_path, case):
    data, problem = leaf_case(case)
    file = tmp_path / "train" / "part.json"
    file.parent.mkdir()
    file.write_text(json.dumps(data))
    with pytest.raises(ValueError) as error:
        load_pool("leaf", path=str(tmp_path))
    message = str(error.value)
    assert "\n" not in message and message.startswith(problem.format(file=file)), message


@pytest.mark.parametrize(
    ("xs", "ys", "problem"),
    [
        (
            ["a" * 80, "b" * 40 + "é" + "b" * 39],
            ["c", "d"],
            "data.params.path: user_data['s']['x'][1] of '{file}' holds 'é' (character 40), "
            "which is not in LEAF's Shakespeare alphabet",
        ),
        (
            ["a" * 80, "b" * 79],
            ["c", "d"],
            "data.params.path: user_data['s']['x'][1] of '{file}' has length 79; every sample "
            "must have the 80 characters",
        ),
        (
            ["a" * 80, "b" * 80],
            ["c", "de"],
            "data.params.path: user_data['s']['y'][1] of '{file}' is 'de', which is not one "
            "character",
        ),
    ],
)
def test_bad_shakespeare_is_one_line(tmp_path, xs, ys, problem):
    file = tmp_path / "train" / "shakespeare.json"
    leaf_file(file, {"s": (xs, ys)})
    with pytest.raises(ValueError) as error:
        load_pool("leaf", path=str(tmp_path))
    message = str(error.value)
    assert "\n" not in message and message.startswith(problem.format(file=file)), message
