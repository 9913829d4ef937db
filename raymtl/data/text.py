"""Characters as token ids: LEAF's Shakespeare alphabet.

LEAF's next-character task (Shakespeare) reads each line window as the indices of its
characters in `ALL_LETTERS`, the 80 characters of LEAF's own `models/utils/language_utils.py`
(in that order): id i is `ALL_LETTERS[i]`, and the label is the id of the next character.

    encode_characters("To be")  -> array([44, 67,  1, 54, 57], dtype=uint8)
    decode_characters([44, 67]) -> "To"
"""

from __future__ import annotations

import numpy as np

ALL_LETTERS = "\n !\"&'(),-.0123456789:;>?ABCDEFGHIJKLMNOPQRSTUVWXYZ[]abcdefghijklmnopqrstuvwxyz}"
VOCABULARY = len(ALL_LETTERS)  # 80
UNKNOWN = 255  # character_ids' id for a character outside the alphabet

# Printable names of the characters (the class names of a next-character task): "\n" as
# the two characters backslash and n, the others as they are.
CHARACTER_NAMES = tuple(c.encode("unicode_escape").decode("ascii") for c in ALL_LETTERS)

_LOOKUP = np.full(128, UNKNOWN, dtype=np.uint8)  # the alphabet is ASCII
_LOOKUP[[ord(c) for c in ALL_LETTERS]] = np.arange(VOCABULARY, dtype=np.uint8)


def character_ids(text: str) -> np.ndarray:
    """(len(text),) uint8: each character's index in ALL_LETTERS, UNKNOWN (255) for one
    outside it."""
    codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    ids = np.full(codes.shape, UNKNOWN, dtype=np.uint8)
    ascii_ = codes < len(_LOOKUP)
    ids[ascii_] = _LOOKUP[codes[ascii_]]
    return ids


def encode_characters(text: str) -> np.ndarray:
    """(len(text),) uint8: each character's index in ALL_LETTERS; a one-line ValueError
    names the first character outside the alphabet and its position."""
    ids = character_ids(text)
    unknown = np.flatnonzero(ids == UNKNOWN)
    if unknown.size:
        position = int(unknown[0])
        raise ValueError(
            f"character {text[position]!r} at position {position} is not in LEAF's Shakespeare "
            f"alphabet ({len(unknown)} such characters)"
        )
    return ids


def decode_characters(ids) -> str:
    """The text of character ids 0..VOCABULARY - 1 (the inverse of encode_characters)."""
    return "".join(ALL_LETTERS[int(i)] for i in np.asarray(ids).reshape(-1))
