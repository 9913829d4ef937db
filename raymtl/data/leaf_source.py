"""A source of data already split by client: LEAF's JSON files (`leaf`). Its pools are keyed
by client (`Pool.keys`): the default partition `natural` gives the federation's client k
exactly the samples of the data's k-th client, the clients in the sorted order of their ids.

    data: {name: leaf, params: {path: leaf/data/femnist/data, max_users: 100}}
        LEAF's JSON: path/train/*.json and, optionally, path/test/*.json (the given test
        split), each {"users": [...], "num_samples": [...], "user_data": {user: {"x": [...],
        "y": [...]}}} ("hierarchies" is ignored). The clients are the sorted union of users;
        max_users keeps the first max_users of them (the real datasets are large). By x:
          numbers (FEMNIST: 784 in [0, 1]; LEAF's Synthetic: 60 features): when their count
            is a perfect square s * s and all lie in [0, 1], grey images (N, 1, s, s), else
            vectors (N, 1, 1, D); float32, scale 1. y: class ids 0, 1, ... as given
            (num_classes = the largest + 1; FEMNIST's 62).
          strings (Shakespeare: 80-character windows, y the next character): tokens
            (N, 1, 1, L) uint8, each character's index in LEAF's alphabet
            (raymtl.data.text.ALL_LETTERS), y the next character's index; vocabulary and
            num_classes 80, scale 1.
        Sent140 (x a list [id, date, query, user, text]) is not supported yet.

A relative `path` is looked up under `data.root` when it is set, else the current folder.
Every data check is a one-line ValueError naming the file, the field and the first bad
sample (or row): NaN or inf features, fractional labels, x, y and client of different
lengths, a client without samples, keys that disagree with the data, a missing file.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from raymtl.data.source_registry import ClientKeys, Pool, register_dataset
from raymtl.data.table_source import SPLITS, _test_start
from raymtl.data.text import CHARACTER_NAMES, UNKNOWN, VOCABULARY, character_ids
from raymtl.data.user_sources import _resolve, check_class_labels, check_finite


@register_dataset("leaf", keyed=True)
def load_leaf(
    root: str | None = None,
    download: bool = False,
    path: str | None = None,
    max_users: int | None = None,
) -> Pool:
    """LEAF's JSON (FEMNIST, Shakespeare, Synthetic): path/train/*.json, path/test/*.json."""
    folder = _resolve(path, root, "leaf")
    if max_users is not None and (
        not isinstance(max_users, int) or isinstance(max_users, bool) or max_users < 1
    ):
        raise ValueError(f"data.params.max_users: {max_users!r} is not a positive integer")
    train_folder = folder / "train"
    if not train_folder.is_dir():
        raise ValueError(
            f"data.params.path: '{train_folder}' is not a folder (LEAF's data folder holds "
            "train/*.json and optionally test/*.json)"
        )
    files = {split: sorted((folder / split).glob("*.json")) for split in SPLITS}
    if not files["train"]:
        raise ValueError(f"data.params.path: '{train_folder}' holds no .json files")
    reader = _LeafReader(max_users)
    for split in SPLITS:
        for file in files[split]:
            reader.read(file, split)
    return reader.pool(str(folder), given_test=bool(files["test"]))


class _LeafReader:
    """LEAF's files read one at a time, keeping only the max_users first users (sorted) seen
    so far: a user left out once is never among the first, whatever the later files hold."""

    def __init__(self, max_users: int | None):
        self.max_users = max_users
        self.seen: set[str] = set()
        self.kind: str | None = None  # "numbers" | "text", from the first sample
        self.width: int | None = None  # numbers per sample, or characters per window
        self.first_file: Path | None = None
        self.samples: dict[tuple[str, str], list] = {}  # (split, user) -> [(x, y, file)]

    def read(self, file: Path, split: str) -> None:
        users, user_data = self._parse(file)
        self.seen.update(users)
        kept = set(users)
        if self.max_users is not None:
            kept = set(sorted(self.seen)[: self.max_users])
            for key in [key for key in self.samples if key[1] not in kept]:
                del self.samples[key]
        for user in users:
            if user not in kept:
                continue
            x, y = user_data[user]["x"], user_data[user]["y"]
            field = f"user_data[{user!r}]"
            decoded = self._samples(x, y, field, file)
            self.samples.setdefault((split, user), []).append((*decoded, file))

    def _parse(self, file: Path):
        """The users of one file and their data, after the checks of its structure."""
        try:
            with open(file, encoding="utf-8") as handle:
                data = json.load(handle)
        except (OSError, ValueError) as error:
            message = " ".join(str(error).split())
            raise ValueError(f"data.params.path: '{file}' is not LEAF JSON ({message})") from None
        if not isinstance(data, dict):
            raise ValueError(f"data.params.path: '{file}' is not LEAF JSON (not an object)")
        for key in ("users", "num_samples", "user_data"):
            if key not in data:
                raise ValueError(
                    f"data.params.path: '{file}' has no {key!r} (LEAF's files hold users, "
                    "num_samples and user_data)"
                )
        users, counts, user_data = data["users"], data["num_samples"], data["user_data"]
        if not isinstance(users, list) or not isinstance(user_data, dict):
            raise ValueError(
                f"data.params.path: users of '{file}' must be a list and user_data an object"
            )
        if not isinstance(counts, list):
            raise ValueError(f"data.params.path: num_samples of '{file}' is not a list")
        if len(counts) != len(users):
            raise ValueError(
                f"data.params.path: num_samples of '{file}' has {len(counts)} entries but "
                f"users {len(users)} (the first unmatched: users[{min(len(users), len(counts))}])"
            )
        listed = set()
        for i, user in enumerate(users):
            if not isinstance(user, str):
                raise ValueError(f"data.params.path: users[{i}] of '{file}' is not a string")
            if user in listed:
                raise ValueError(f"data.params.path: users[{i}] of '{file}' repeats user {user!r}")
            listed.add(user)
            if user not in user_data:
                raise ValueError(
                    f"data.params.path: users[{i}] {user!r} of '{file}' has no entry in user_data"
                )
            entry = user_data[user]
            if not isinstance(entry, dict) or "x" not in entry or "y" not in entry:
                raise ValueError(
                    f"data.params.path: user_data[{user!r}] of '{file}' has no lists x and y"
                )
            x, y = entry["x"], entry["y"]
            if not isinstance(x, list) or not isinstance(y, list):
                raise ValueError(
                    f"data.params.path: user_data[{user!r}] of '{file}' has no lists x and y"
                )
            if len(x) != len(y):
                raise ValueError(
                    f"data.params.path: user_data[{user!r}]['x'] of '{file}' has {len(x)} "
                    f"samples but ['y'] {len(y)} (the first unmatched: sample "
                    f"{min(len(x), len(y))})"
                )
            if counts[i] == 0 or not x:
                raise ValueError(
                    f"data.params.path: users[{i}] {user!r} of '{file}' holds no samples "
                    f"(num_samples[{i}] {counts[i]}, {len(x)} in user_data)"
                )
            if counts[i] != len(x):
                raise ValueError(
                    f"data.params.path: num_samples[{i}] of '{file}' is {counts[i]} but "
                    f"user_data[{user!r}] holds {len(x)} samples"
                )
        extra = [user for user in user_data if user not in listed]
        if extra:
            raise ValueError(
                f"data.params.path: user_data of '{file}' holds user {extra[0]!r}, which "
                f"users does not list ({len(extra)} such users)"
            )
        return users, user_data

    def _detect(self, sample: object, label: object, field: str, file: Path) -> None:
        """The kind of the dataset, from its first sample."""
        if isinstance(sample, str):
            if not (isinstance(label, str) and len(label) == 1):
                raise ValueError(
                    f"data.params.path: {field}['y'][0] of '{file}' is {label!r}: samples of "
                    "text need the next character as label (LEAF's Shakespeare); other LEAF "
                    "datasets of strings (CelebA's image names) are not supported yet"
                )
            self.kind, self.width = "text", len(sample)
        elif isinstance(sample, list) and sample and all(_is_number(v) for v in sample):
            self.kind, self.width = "numbers", len(sample)
        elif isinstance(sample, list) and any(isinstance(v, str) for v in sample):
            raise ValueError(
                f"data.params.path: {field}['x'][0] of '{file}' is a list of strings (LEAF's "
                "Sent140: [id, date, query, user, text]); Sent140 is not supported yet"
            )
        else:
            raise ValueError(
                f"data.params.path: {field}['x'][0] of '{file}' is neither a list of numbers "
                "(FEMNIST, Synthetic) nor a string (Shakespeare)"
            )
        self.first_file = file

    def _samples(self, xs: list, ys: list, field: str, file: Path):
        if self.kind is None:
            self._detect(xs[0], ys[0], field, file)
        if self.kind == "text":
            return self._text(xs, ys, field, file)
        return self._numbers(xs, ys, field, file)

    def _check_widths(self, xs: list, field: str, file: Path, what: type) -> None:
        for i, sample in enumerate(xs):
            if not isinstance(sample, what) or len(sample) != self.width:
                shown = (
                    f"has length {len(sample)}"
                    if isinstance(sample, what)
                    else f"is a {type(sample).__name__}"
                )
                unit = "characters" if what is str else "numbers"
                raise ValueError(
                    f"data.params.path: {field}['x'][{i}] of '{file}' {shown}; every sample "
                    f"must have the {self.width} {unit} of the first ('{self.first_file}')"
                )

    def _numbers(self, xs: list, ys: list, field: str, file: Path):
        self._check_widths(xs, field, file, list)
        try:
            x = np.asarray(xs, dtype=np.float32)
        except (TypeError, ValueError):
            i = next((i for i, s in enumerate(xs) if not all(_is_number(v) for v in s)), 0)
            raise ValueError(
                f"data.params.path: {field}['x'][{i}] of '{file}' holds a value that is not a "
                "number"
            ) from None
        check_finite(x, f"{field}['x']", file)
        if not all(_is_number(v) for v in ys):
            i = next(i for i, v in enumerate(ys) if not _is_number(v))
            raise ValueError(
                f"data.params.path: {field}['y'][{i}] of '{file}' is {ys[i]!r}, not a class id"
            )
        y = np.asarray(ys, dtype=np.float64)
        check_class_labels(y, f"{field}['y']", file)
        if (y < 0).any():
            i = int(np.flatnonzero(y < 0)[0])
            raise ValueError(
                f"data.params.path: {field}['y'][{i}] of '{file}' is {ys[i]!r}; class ids are "
                "0, 1, ..."
            )
        return x, y.astype(np.int64)

    def _text(self, xs: list, ys: list, field: str, file: Path):
        self._check_widths(xs, field, file, str)
        ids = character_ids("".join(xs))
        unknown = np.flatnonzero(ids == UNKNOWN)
        if unknown.size:
            sample, at = divmod(int(unknown[0]), self.width)
            raise ValueError(
                f"data.params.path: {field}['x'][{sample}] of '{file}' holds "
                f"{xs[sample][at]!r} (character {at}), which is not in LEAF's Shakespeare "
                "alphabet (raymtl.data.text.ALL_LETTERS)"
            )
        for i, label in enumerate(ys):
            good = isinstance(label, str) and len(label) == 1
            if not good or character_ids(label)[0] == UNKNOWN:
                problem = "is not one character" if not good else "is not in LEAF's alphabet"
                raise ValueError(
                    f"data.params.path: {field}['y'][{i}] of '{file}' is {label!r}, which "
                    f"{problem} (the next character of its window)"
                )
        return ids.reshape(len(xs), 1, 1, self.width), character_ids("".join(ys)).astype(np.int64)

    def pool(self, source: str, given_test: bool) -> Pool:
        names = tuple(sorted({user for _, user in self.samples}))
        if self.max_users is not None:
            names = names[: self.max_users]
        index = {user: k for k, user in enumerate(names)}
        xs, ys, owners, splits = [], [], [], []
        for split in SPLITS:
            for user in names:
                for x, y, _ in self.samples.get((split, user), []):
                    xs.append(x)
                    ys.append(y)
                    owners.append(np.full(len(y), index[user], dtype=np.int64))
                    splits.append(np.full(len(y), split == "test"))
        x, y = np.concatenate(xs), np.concatenate(ys)
        client = np.concatenate(owners)
        test = np.concatenate(splits) if given_test else None
        keys = ClientKeys(client, names, test, None, source)
        if self.kind == "text":
            tensor = torch.from_numpy(np.ascontiguousarray(x))
            return Pool(
                tensor,
                torch.from_numpy(y),
                VOCABULARY,
                CHARACTER_NAMES,
                1.0,
                source,
                _test_start(test),
                keys,
                inputs="tokens",
                vocabulary=VOCABULARY,
            )
        side = math.isqrt(self.width)
        if side * side == self.width and x.min() >= 0.0 and x.max() <= 1.0:
            x, inputs = x.reshape(len(x), 1, side, side), "images"
        else:
            x, inputs = x[:, None, None, :], "vectors"
        num_classes = int(y.max()) + 1
        return Pool(
            torch.from_numpy(np.ascontiguousarray(x)),
            torch.from_numpy(y),
            num_classes,
            tuple(str(i) for i in range(num_classes)),
            1.0,
            source,
            _test_start(test),
            keys,
            inputs=inputs,
        )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
