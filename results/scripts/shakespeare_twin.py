"""A text in LEAF Shakespeare's format, made from the plain-text licences Debian ships
(/usr/share/common-licenses): one speaker per licence, as LEAF has one client per role.

    python results/scripts/shakespeare_twin.py data/shakespeare_twin   # train/ and test/ JSON

LEAF's preprocessing (leaf/data/shakespeare): each speaker's text becomes 80-character
windows x with the next character as y, over LEAF's 80-character alphabet. Here characters
outside the alphabet become spaces and runs of spaces one space; a window starts every
`--stride` characters (LEAF: every character); the last `--test` share of each text is that
speaker's test split (LEAF draws its test samples at random; a tail keeps test windows from
overlapping train windows). LEAF Shakespeare itself (1,129 roles of the plays) is not on
this machine: results/shakespeare.md says which text each figure is on.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from raymtl.data.text import ALL_LETTERS

LICENCES = Path("/usr/share/common-licenses")
WINDOW = 80


def clean(text: str) -> str:
    """The text over LEAF's alphabet: other characters are spaces, space runs one space."""
    kept = "".join(c if c in ALL_LETTERS else " " for c in text)
    return re.sub(r" +", " ", re.sub(r"\n\s*\n+", "\n", kept))


def windows(text: str, stride: int) -> tuple[list[str], list[str]]:
    starts = range(0, len(text) - WINDOW, stride)
    return [text[s : s + WINDOW] for s in starts], [text[s + WINDOW] for s in starts]


def write(folder: Path, speakers: dict[str, tuple[list[str], list[str]]], split: str) -> None:
    users = sorted(speakers)
    payload = {
        "users": users,
        "num_samples": [len(speakers[u][0]) for u in users],
        "user_data": {u: {"x": speakers[u][0], "y": speakers[u][1]} for u in users},
    }
    (folder / split).mkdir(parents=True, exist_ok=True)
    (folder / split / f"all_data_{split}.json").write_text(json.dumps(payload))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--stride", type=int, default=4)
    parser.add_argument("--test", type=float, default=0.2)
    parser.add_argument("--min-chars", type=int, default=6000)
    args = parser.parse_args()
    files = sorted(p for p in LICENCES.iterdir() if p.is_file() and not p.is_symlink())
    train, test = {}, {}
    for file in files:
        text = clean(file.read_text(errors="replace"))
        if len(text) < args.min_chars:  # too short to give a speaker train and test windows
            continue
        cut = int(len(text) * (1 - args.test))
        train[file.name] = windows(text[:cut], args.stride)
        test[file.name] = windows(text[cut - WINDOW :], args.stride)
    write(args.out, train, "train")
    write(args.out, test, "test")
    counts = ", ".join(f"{u} {len(train[u][0])}/{len(test[u][0])}" for u in sorted(train))
    print(f"{len(train)} speakers (train/test windows): {counts}")


if __name__ == "__main__":
    main()
