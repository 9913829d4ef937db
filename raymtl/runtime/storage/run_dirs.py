"""A run's directory: where a new one is made (a path or a URI), its config.yaml, what may
change when it is resumed, what is written once it has run (summary, plots), and the marks of
a run that stopped on an error in an algorithm's code (FAILED, run.log)."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import yaml

from raymtl.config import ConfigError, ExperimentConfig, apply_override, dump_config, parse_config
from raymtl.data.sources import DEFAULT_CACHE_ROOT
from raymtl.paths import make_directory
from raymtl.runtime.storage.checkpoints import (
    DamagedCheckpoint,
    checkpoint_dir,
    config_hash,
    latest_checkpoint,
    read_manifest,
)
from raymtl.runtime.storage.location import Location, fetch, is_uri, publish

# What a resume may change: the rounds (only more), and where and how it runs (the executors
# give identical results: a run may resume on another machine or cluster).
RESUMABLE_CHANGES = ("rounds", "runtime")
# A run stopped by an exception in an algorithm's step: FAILED holds its one line, run.log the
# whole traceback of every such failure (appended: a resumed run that fails again adds its own).
FAILED, RUN_LOG = "FAILED", "run.log"


def check_output_dir(cfg: ExperimentConfig) -> None:
    """Inside a `ray job submit` job the working directory is Ray's unpacked copy of the
    code: a relative output.dir would put the results there, and they would go with it."""
    relative = not is_uri(cfg.output.dir) and not Path(cfg.output.dir).is_absolute()
    if relative and "_ray_pkg_" in str(Path.cwd()):
        raise ConfigError(
            f"output.dir: '{cfg.output.dir}' is relative inside a Ray job (it would land in "
            "Ray's package folder); give an absolute path on storage every node shares"
        )


def staging_dir(store: Location) -> Path:
    """The local folder where the driver writes a URI run's outputs before publishing them."""
    digest = hashlib.blake2b(store.uri.encode(), digest_size=6).hexdigest()
    return Path(DEFAULT_CACHE_ROOT).expanduser() / "staging" / f"{store.name}-{digest}"


def resumable_location(output_dir: str, local: Path) -> str:
    """What `raymtl run --resume` takes for the run written to the local folder `local`
    under `output_dir`: the folder itself, or the run's URI when it lives at one (its
    staging folder is named after it)."""
    if is_uri(output_dir):
        uri = Location.of(output_dir).child(local.name.rsplit("-", 1)[0]).uri
        if staging_dir(Location.of(uri)) == local:
            return uri
    return str(local)


def run_location(where: str | Path) -> tuple[Path, Location]:
    """(the local folder the driver writes, where the run lives): the same folder for a
    path, a staging folder and the URI for a URI."""
    if is_uri(where):
        store = Location.of(where)
        return make_directory(staging_dir(store), exist_ok=True), store
    local = make_directory(Path(where), exist_ok=True)
    return local, Location.of(local)


def new_run_dir(cfg: ExperimentConfig) -> tuple[Path, Location]:
    """<output.dir>/<name>-<timestamp>, made unique if two runs start in the same second."""
    check_output_dir(cfg)
    root, base = Location.of(cfg.output.dir), f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}"
    name, suffix = base, 1
    while root.child(name).entries() or root.child(name).is_file():
        name, suffix = f"{base}-{suffix}", suffix + 1
    return run_location(root.child(name).uri)  # absolute: printed and returned as such


def start_run(cfg: ExperimentConfig, run_dir: str | Path | None = None) -> tuple[Path, Location]:
    """A new run of `cfg` in `run_dir` (default: a new folder under output.dir) with its
    config.yaml: (the local folder, where the run lives). Its federation is checked first
    (executors/planning.py `start_checked_run`)."""
    local, store = run_location(run_dir) if run_dir else new_run_dir(cfg)
    (local / "config.yaml").write_text(dump_config(cfg))
    return local, store


def reopen_run(cfg: ExperimentConfig, run_dir: str | Path) -> tuple[Path, Location]:
    """An existing run (a path or a URI) to go on with `cfg`, which may only change what a
    resume may change; the outputs so far are fetched from a URI. With more rounds than it
    ran, its finished seeds go on from their last checkpoint."""
    saved = load_run_config(run_dir)
    checkpoints_config(saved, Location.of(run_dir))  # config.yaml as the checkpoints hold it
    check_resumable(saved, cfg)
    local, store = run_location(run_dir)
    if is_uri(store.uri):  # the outputs so far, from the URI into the staging folder
        fetch(store, local)
    if cfg.rounds > saved.rounds:  # a longer run: finished seeds are open again
        checkpoints = store.child("checkpoints")
        for seed in checkpoints.entries():
            checkpoints.child(seed, "DONE").delete()
        (local / "config.yaml").write_text(dump_config(cfg))
    return local, store


def load_run_config(run_dir: str | Path, overrides: list[str] = ()) -> ExperimentConfig:
    """A run's config.yaml (a path or a URI), with overrides."""
    store = Location.of(run_dir)
    if not store.child("config.yaml").is_file():
        raise ConfigError(f"--resume: '{run_dir}' has no config.yaml (not a run directory)")
    try:
        raw = yaml.safe_load(store.child("config.yaml").read_bytes().decode())
    except (ValueError, yaml.YAMLError):  # not UTF-8, not YAML
        raise ConfigError(
            f"--resume: {store.child('config.yaml')} is not a config raymtl wrote"
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--resume: {store.child('config.yaml')} is not a config raymtl wrote")
    for assignment in overrides:
        apply_override(raw, assignment)
    return parse_config(raw)


def check_resumable(saved: ExperimentConfig, cfg: ExperimentConfig) -> None:
    """Refuse, in one line naming the field, a resume whose config changed what the run is."""
    if cfg.rounds < saved.rounds:
        raise ConfigError(f"rounds: {cfg.rounds} < {saved.rounds} of the run (it may only grow)")
    before, after = saved.model_dump(mode="json"), cfg.model_dump(mode="json")
    for field, old, new in changed_fields(before, after):
        if field.split(".")[0] not in RESUMABLE_CHANGES:
            raise ConfigError(
                f"{field}: {old!r} in the run, {new!r} now; --resume keeps the run's settings "
                "(only rounds may grow; start a new run instead)"
            )


def bound_config(cfg: ExperimentConfig) -> dict:
    """The settings a checkpoint is bound to: all but what a resume may change."""
    dumped = cfg.model_dump(mode="json")
    return {key: value for key, value in dumped.items() if key not in RESUMABLE_CHANGES}


def check_bound(cfg: ExperimentConfig, manifest: dict, where: str) -> None:
    """Refuse, in one line naming the fields, a config that is not the one checkpoint
    `where` was written with (its manifest's `config`; older manifests have none). A field
    of raymtl's sections that the manifest does not hold (one added to raymtl since) is not
    compared; a key of a free `params` mapping always is (its absence meant the default)."""
    recorded = manifest.get("config")
    if not isinstance(recorded, dict):
        return
    if manifest.get("config_sha256") == config_hash(bound_config(cfg)):
        return
    changes = []
    for field, old, new in changed_fields(recorded, bound_config(cfg)):
        known = field_known(recorded, field)
        if known or ".params." in f".{field}":
            was = repr(old) if known else "unset"
            changes.append(f"{field}: {was} in the checkpoints, {new!r} now")
    if changes:
        raise ConfigError(
            f"{'; '.join(changes)} ({where}); --resume needs the settings its checkpoints "
            "were written with: restore them (config.yaml), or start a new run"
        )


def field_known(recorded: dict, field: str) -> bool:
    """Whether a dotted field exists in a recorded config (its value may be None)."""
    node = recorded
    for part in field.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def checkpoints_config(cfg: ExperimentConfig, store: Location) -> None:
    """Every seed's latest checkpoint must have been written with `cfg`'s settings (a
    config.yaml edited in the run directory is refused before anything runs or changes)."""
    checkpoints = store.child("checkpoints")
    for seed_name in sorted(checkpoints.entries()):
        seed_dir = checkpoints.child(seed_name)
        latest = latest_checkpoint(seed_dir)
        if not latest:
            continue
        try:
            manifest = read_manifest(checkpoint_dir(seed_dir, latest))
        except DamagedCheckpoint:  # the run falls back from it (federation.py)
            continue
        check_bound(cfg, manifest, f"checkpoints/{seed_name}/round{latest:05d}")


def changed_fields(before, after, prefix: str = ""):
    """(dotted field, old, new) for every leaf that differs between two config mappings."""
    if isinstance(before, dict) and isinstance(after, dict):
        for key in sorted(set(before) | set(after)):
            yield from changed_fields(before.get(key), after.get(key), f"{prefix}{key}.")
    elif before != after:
        yield prefix.rstrip("."), before, after


def finish_run(cfg: ExperimentConfig, run_dir: Path, store: Location, callbacks=()) -> None:
    """Once every seed has run: summary.json, the plots (output.plots), the outputs copied
    to where the run lives, then the callbacks' on_run_end."""
    from raymtl.metrics import plot_run, summarize

    summarize(run_dir, cfg.algorithm.name, cfg.model_dump(mode="json"))
    if cfg.output.plots:
        plot_run(run_dir)
    publish(run_dir, store)
    for callback in callbacks:
        callback.on_run_end(run_dir)


def mark_failed(run_dir: Path, store: Location, line: str, details: str) -> str:
    """Mark a run stopped by an error in an algorithm's code (a StepFailed): FAILED with its
    line, and run.log with the time, the line and the step's whole traceback, in the run
    directory and where the run lives. Returns where run.log is (a path or a URI), for the
    line the user reads; an interrupted run has neither file, and `raymtl run --resume`
    goes on from the last complete checkpoint either way."""
    run_dir = Path(run_dir)
    (run_dir / FAILED).write_text(f"{line}\n")
    with (run_dir / RUN_LOG).open("a") as log:
        log.write(f"{time.strftime('%Y-%m-%d %H:%M:%S')} FAILED: {line}\n{details.rstrip()}\n\n")
    publish(run_dir, store)
    return store.child(RUN_LOG).uri


def failed_line(run_dir: str | Path) -> str | None:
    """The line of a run marked FAILED (`mark_failed`; a path or a URI), or None."""
    marker = Location.of(run_dir).child(FAILED)
    return marker.read_text().strip() if marker.is_file() else None


def clear_failed(run_dir: Path, store: Location) -> str | None:
    """A failed run goes on (`raymtl run --resume`, the code fixed): its FAILED mark goes (a
    new failure writes it again; run.log keeps the old traceback). Returns the old line."""
    line = failed_line(store.uri)
    if line is not None:
        store.child(FAILED).delete()
        (Path(run_dir) / FAILED).unlink(missing_ok=True)
    return line
