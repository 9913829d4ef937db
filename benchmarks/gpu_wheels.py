"""The wheels a lent GPU machine lacks for `make gpu-check`, downloaded into an ignored folder.

That machine has Python 3.12 with torch, numpy, pandas, pyarrow, networkx, scikit-learn,
scipy, matplotlib, typer, rich, pyyaml, aiohttp, grpcio, protobuf, click, filelock, msgpack,
requests... but no Ray, no igraph / leidenalg, no pydantic, and no network: what is missing
travels as wheels with the working tree, 64 MiB a call in all. Ray's wheel alone is ~79 MB,
so it is repacked without `ray/jars/` (Java workers) and the dashboard's web client
(`ray/dashboard/client/build/`), neither of which a local Python-only Ray uses; its RECORD
loses their lines, so the repacked wheel stays valid (every file listed with its hash).

Versions are this project's .venv's (what the tests run against). Standard library only.

    python3 benchmarks/gpu_wheels.py                          # cp312 wheels into .whl/
    python3 benchmarks/gpu_wheels.py --python 3.11 --dest .whl311   # this machine's Python,
                                                              # for a simulation here
"""

from __future__ import annotations

import argparse
import base64
import csv
import hashlib
import io
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_PYTHON = ROOT / ".venv" / "bin" / "python"
LIMIT_MIB = 64  # what one device call carries: working tree and carried folders together

# Distributions the GPU machine's image lacks (its package list: the device README's
# KINDS.md), each with the reason it is needed. Their own requirements that the image has
# (attrs, typing-extensions, click, filelock, msgpack, packaging, protobuf, pyyaml,
# requests) are not carried.
MISSING = {
    "ray": "raymtl.runtime's actors",
    "jsonschema": "Ray's requirement",
    "jsonschema-specifications": "jsonschema's requirement",
    "referencing": "jsonschema's requirement",
    "rpds-py": "referencing's requirement",
    "pydantic": "raymtl.config",
    "pydantic-core": "pydantic's requirement",
    "annotated-types": "pydantic's requirement",
    "typing-inspection": "pydantic's requirement",
    "igraph": "raymtl.graph (communities, Leiden)",
    "texttable": "igraph's requirement",
    "leidenalg": "raymtl.graph (Leiden communities)",
}
# Inside Ray's wheel: folders a local Ray with Python workers and no dashboard never reads.
RAY_DROPPED = ("ray/jars/", "ray/dashboard/client/build/")
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (28, 27, 24, 17)] + [
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
]


def installed_version(name: str) -> str:
    """The version of `name` in this project's .venv (the one its tests run against)."""
    code = f"import importlib.metadata as m; print(m.version({name!r}))"
    python = VENV_PYTHON if VENV_PYTHON.exists() else Path(sys.executable)
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{name}: not installed in {python.parent.parent}; run `make install` first")
    return done.stdout.strip()


def download(requirement: str, dest: Path, python_version: str) -> None:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "-q",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        *platforms,
        "-d",
        str(dest),
        requirement,
    ]
    subprocess.run(command, check=True)


def record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def record_name(archive: zipfile.ZipFile) -> str:
    # The wheel's own, at the top (Ray vendors packages with dist-info folders of their own).
    (name,) = [n for n in archive.namelist() if re.fullmatch(r"[^/]+\.dist-info/RECORD", n)]
    return name


def repack_without(wheel: Path, dropped: tuple[str, ...]) -> int:
    """Rewrite `wheel` in place without the files under `dropped`, its RECORD without their
    lines; returns the number of files dropped (0: already repacked)."""
    with zipfile.ZipFile(wheel) as source:
        record = record_name(source)
        kept = [i for i in source.infolist() if not i.filename.startswith(dropped)]
        gone = len(source.infolist()) - len(kept)
        if gone == 0:
            return 0
        rows = csv.reader(io.StringIO(source.read(record).decode()))
        lines = [row for row in rows if row and not row[0].startswith(dropped)]
        text = io.StringIO()
        csv.writer(text, lineterminator="\n").writerows(lines)
        partial = wheel.with_suffix(".partial")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as target:
            for info in kept:  # the same names, modes (executables stay so) and dates
                data = text.getvalue().encode() if info.filename == record else None
                target.writestr(info, data if data is not None else source.read(info))
    partial.replace(wheel)
    return gone


def check_wheel(wheel: Path) -> None:
    """A valid wheel: every file listed in RECORD with its sha256 and size, nothing listed
    that is missing (RECORD itself has no hash)."""
    with zipfile.ZipFile(wheel) as archive:
        record = record_name(archive)
        rows = {row[0]: row for row in csv.reader(io.StringIO(archive.read(record).decode()))}
        names = set(archive.namelist())
        for name in names - {record}:
            if name.endswith("/"):
                continue
            row = rows.get(name)
            data = archive.read(name)
            if row is None or row[1] != record_hash(data) or row[2] != str(len(data)):
                sys.exit(f"{wheel.name}: {name} does not match its RECORD line")
        listed = {name for name, row in rows.items() if row[1]}
        if listed - names:
            sys.exit(f"{wheel.name}: RECORD lists {sorted(listed - names)[0]}, not in the wheel")


def tree_bytes() -> int:
    """What travels besides the carried folders: tracked and untracked-not-ignored files."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "-co", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    paths = [ROOT / p.decode() for p in listed if p]
    return sum(p.stat().st_size for p in paths if p.is_file())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default="3.12", help="the Python the wheels are for")
    parser.add_argument("--dest", default=".whl", help="folder (relative to the repository)")
    args = parser.parse_args()
    dest = ROOT / args.dest
    dest.mkdir(exist_ok=True)
    for name in MISSING:
        version = installed_version(name)
        stem = name.replace("-", "_").lower()
        found = [w for w in dest.glob("*.whl") if w.name.lower().startswith(f"{stem}-")]
        if any(w.name.lower().startswith(f"{stem}-{version}-") for w in found):
            continue
        for stale in found:  # two versions of one package stop the whole install
            stale.unlink()
        download(f"{name}=={version}", dest, args.python)
    (ray_wheel,) = dest.glob("ray-*.whl")
    dropped = repack_without(ray_wheel, RAY_DROPPED)
    for wheel in sorted(dest.glob("*.whl")):
        check_wheel(wheel)
        print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    if dropped:
        print(f"ray: {dropped} files under {', '.join(RAY_DROPPED)} dropped, RECORD rewritten")
    wheels = sum(w.stat().st_size for w in dest.glob("*.whl"))
    tree = tree_bytes()
    total = (wheels + tree) / 2**20
    print(
        f"{args.dest}: {wheels / 2**20:.1f} MiB; working tree: {tree / 2**20:.1f} MiB; "
        f"together {total:.1f} MiB of the {LIMIT_MIB} MiB a device call carries"
    )
    if total > LIMIT_MIB:
        sys.exit(f"{args.dest}: too large to travel with the working tree ({total:.1f} MiB)")


if __name__ == "__main__":
    main()
