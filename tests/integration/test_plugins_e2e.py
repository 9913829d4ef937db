"""The examples as a user runs them: examples/ copied to a folder outside the repository, so
their plugins (the FedAvgM and sample-weighted SCAFFOLD algorithms, `fedavgm` and
`scaffold_samples`; the `bars` dataset and `tiny_cnn` model) are found only through the
experiment file's `plugins:`. They give the same results on the Inline and the Ray executor,
resume exactly, compare with a built-in algorithm, and run through `ray job submit` with the
project as the job's working_dir or as py_modules."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from typer.testing import CliRunner

from raymtl.cli import app
from raymtl.config import load_config
from raymtl.runtime import resume_experiment, run_experiment
from tests.integration.test_job_submit import RAY, token_head  # noqa: F401 (a fixture)

ROOT = Path(__file__).resolve().parents[2]
# Small and quick: the examples' settings otherwise (their plugins, data, model, algorithm).
QUICK = {
    "rounds": 3,
    "seeds": [0],
    "checkpoint_every": 1,
    "data.num_clients": 4,
    "runtime.executor": "inline",
    "runtime.dashboard": False,
}
EXAMPLES = {
    "fedavgm": ("fedavgm", "fedavgm_digits.yaml", {"data.partition.max_samples_per_client": 60}),
    "own_data": ("own_data", "own_data.yaml", {"data.params.num_samples": 400}),
    "scaffold": ("scaffold", "scaffold_digits.yaml", {"data.partition.max_samples_per_client": 60}),
}
CLIENT_COLUMNS = ["seed", "round", "client", "loss", "accuracy", "samples", "bits_up", "bits_down"]
ROUND_COLUMNS = ["seed", "round", "mean_accuracy", "mean_loss", "bits_up", "bits_down"]


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """examples/ copied outside the repository (one copy per module: a plugin module is
    imported once per process, as a user's would be)."""
    copy = tmp_path_factory.mktemp("user") / "examples"
    shutil.copytree(ROOT / "examples", copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


@pytest.fixture(scope="module", autouse=True)
def registries_without_the_repository_examples():
    """Another test module of the session may have imported the examples from the
    repository: their entries would clash with the copy's (two files may not register one
    name). Set them aside while this module runs; put them back after it."""
    from raymtl.algorithms.registry import ALGORITHMS
    from raymtl.data.source_registry import SOURCES
    from raymtl.models.registry import MODELS

    registries = [(ALGORITHMS, "fedavgm"), (ALGORITHMS, "scaffold_samples")]
    registries += [(SOURCES, "bars"), (MODELS, "tiny_cnn")]
    saved = [(registry, name, registry.pop(name, None)) for registry, name in registries]
    yield
    for registry, name, entry in saved:
        registry.pop(name, None)
        if entry is not None:
            registry[name] = entry


def set_dotted(raw: dict, key: str, value) -> None:
    *parents, leaf = key.split(".")
    for part in parents:
        raw = raw.setdefault(part, {})
    raw[leaf] = value


def quick_experiment(project: Path, example: str, out: Path, **settings) -> Path:
    """The example's experiment file made quick, written next to it (so its relative
    `plugins:` path still points at the example's module); returns its path."""
    folder, filename, extra = EXAMPLES[example]
    raw = yaml.safe_load((project / folder / filename).read_text())
    for key, value in {**QUICK, **extra, **settings}.items():
        set_dotted(raw, key, value)
    raw["output"] = {"dir": str(out), "plots": False}
    path = project / folder / f"quick_{out.name}_{filename}"
    path.write_text(yaml.safe_dump(raw))
    return path


def clients_of(run_dir) -> pd.DataFrame:
    frame = pd.read_parquet(Path(run_dir) / "clients.parquet")
    return frame.sort_values(["seed", "round", "client"]).reset_index(drop=True)[CLIENT_COLUMNS]


def rounds_of(run_dir) -> pd.DataFrame:
    frame = pd.read_parquet(Path(run_dir) / "rounds.parquet")
    return frame.sort_values(["seed", "round"]).reset_index(drop=True)[ROUND_COLUMNS]


def run(path: Path, run_dir: Path, *overrides: str, stop_after: int | None = None) -> Path:
    return Path(run_experiment(load_config(path, list(overrides)), run_dir, stop_after=stop_after))


def plugin_module(algorithm: str):
    """The module a plugin algorithm was imported from (by the experiment's `plugins:`)."""
    from raymtl.algorithms.registry import get_algorithm

    return sys.modules[get_algorithm(algorithm).__module__]


def test_fedavgm_server_step_by_hand(project, tmp_path):
    """v' = β·v + (w − a); w' = w − η_s·v', on numbers worked out by hand."""
    load_config(quick_experiment(project, "fedavgm", tmp_path))  # imports the plugin
    step = plugin_module("fedavgm").server_momentum_step
    w, a = {"x": torch.tensor([1.0, -2.0])}, {"x": torch.tensor([0.5, 0.0])}
    v = {"x": torch.tensor([0.2, 1.0])}
    weights, velocity = step(w, a, v, momentum=0.9, lr=1.0)
    # v' = 0.9·[0.2, 1] + ([1, -2] − [0.5, 0]) = [0.68, -1.1]; w' = [1, -2] − v' = [0.32, -0.9]
    torch.testing.assert_close(velocity["x"], torch.tensor([0.68, -1.1]))
    torch.testing.assert_close(weights["x"], torch.tensor([0.32, -0.9]))
    weights, velocity = step(w, a, v, momentum=0.5, lr=2.0)
    # v' = 0.5·[0.2, 1] + [0.5, -2] = [0.6, -1.5]; w' = [1, -2] − 2·v' = [-0.2, 1.0]
    torch.testing.assert_close(velocity["x"], torch.tensor([0.6, -1.5]))
    torch.testing.assert_close(weights["x"], torch.tensor([-0.2, 1.0]))
    # β = 0, η_s = 1: the server takes the average itself, bit for bit (FedAvg).
    odd = {"x": torch.tensor([1.0, 3e-8, -7.25])}
    average = {"x": torch.tensor([1e-8, 0.1, 2.0])}
    weights, _ = step(odd, average, {"x": torch.tensor([5.0, 5.0, 5.0])}, momentum=0.0, lr=1.0)
    assert torch.equal(weights["x"], average["x"])


def test_fedavgm_without_momentum_is_fedavg_exactly(project, tmp_path):
    """β = 0, η_s = 1 reproduces the built-in fedavg run bit for bit; the defaults do not."""
    path = quick_experiment(project, "fedavgm", tmp_path)
    plain = run(path, tmp_path / "fedavgm0", "algorithm.params.server_momentum=0")
    fedavg = run(path, tmp_path / "fedavg", "algorithm.name=fedavg")
    pd.testing.assert_frame_equal(clients_of(plain), clients_of(fedavg))
    momentum, plain = clients_of(run(path, tmp_path / "fedavgm")), clients_of(fedavg)
    assert not momentum["loss"].equals(plain["loss"])  # the defaults (β = 0.9) differ
    bits = ["round", "client", "bits_up", "bits_down"]  # the same traffic as FedAvg
    pd.testing.assert_frame_equal(momentum[bits], plain[bits])
    uploads = momentum.groupby("round")["bits_up"].apply(lambda b: (b > 0).sum())
    assert uploads.tolist() == [2, 2, 2]  # ⌈0.5·4⌉ sampled clients upload each round


def test_scaffold_round_one_is_fedavgs_with_twice_the_bits(project, tmp_path):
    """c = c_i = 0 in round 1 and η_g = 1: SCAFFOLD's first round is FedAvg's exactly, with
    the control variates' bits besides (x and c down, y_i and Δc_i up). From round 2 the
    correction changes the models."""
    path = quick_experiment(project, "scaffold", tmp_path)
    scaffold = clients_of(run(path, tmp_path / "scaffold"))
    fedavg = clients_of(run(path, tmp_path / "fedavg", "algorithm.name=fedavg"))
    first, bits = scaffold["round"] == 1, ["bits_up", "bits_down"]
    same = [column for column in CLIENT_COLUMNS if column not in bits]
    pd.testing.assert_frame_equal(scaffold.loc[first, same], fedavg.loc[first, same])
    pd.testing.assert_frame_equal(scaffold[bits], 2 * fedavg[bits])
    assert (scaffold["bits_up"] > 0).sum() == 3 * 2  # ⌈0.5·4⌉ clients a round upload
    later = ~first
    assert not scaffold.loc[later, "loss"].equals(fedavg.loc[later, "loss"])


def test_scaffold_refuses_momentum_in_one_line(project, tmp_path):
    path = quick_experiment(project, "scaffold", tmp_path)
    result = CliRunner().invoke(app, ["run", str(path), "algorithm.params.momentum=0.5"])
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == (
        "error: algorithm.params.momentum: SCAFFOLD's correction needs plain SGD steps (use 0)"
    )
    assert list(tmp_path.iterdir()) == []  # refused before any run directory (output.dir)


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_an_example_resumes_exactly(project, tmp_path, example):
    """Stopped after round 1 and resumed: the uninterrupted run (FedAvgM's velocity comes back
    from the server's checkpoint)."""
    path = quick_experiment(project, example, tmp_path)
    whole = run(path, tmp_path / "whole")
    broken = run(path, tmp_path / "broken", stop_after=1)
    assert rounds_of(broken)["round"].tolist() == [1]
    resumed = Path(resume_experiment(broken))
    pd.testing.assert_frame_equal(clients_of(whole), clients_of(resumed))
    pd.testing.assert_frame_equal(rounds_of(whole), rounds_of(resumed))
    assert rounds_of(whole)["round"].tolist() == [1, 2, 3]


def test_compare_a_plugin_algorithm_with_a_builtin_one(project, tmp_path):
    path = quick_experiment(project, "fedavgm", tmp_path, rounds=2)
    out = tmp_path / "cmp"
    args = ["compare", str(path), "algorithm.name=fedavgm,fedavg", "--out", str(out)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    table = pd.read_csv(out / "table.csv").set_index("experiment")
    assert set(table.index) == {"fedavgm-digits-fedavgm", "fedavgm-digits-fedavg"}
    # The same traffic (the velocity never leaves the server), other models.
    bits = table["total_bits_mean"]
    assert bits["fedavgm-digits-fedavgm"] == bits["fedavgm-digits-fedavg"] > 0
    losses = [clients_of(out / arm)["loss"] for arm in sorted(table.index)]
    assert not losses[0].equals(losses[1])
    for arm in table.index:
        config = yaml.safe_load((out / arm / "config.yaml").read_text())
        assert config["algorithm"]["name"] == arm.rsplit("-", 1)[1]
        assert rounds_of(out / arm)["round"].tolist() == [1, 2]


@pytest.mark.ray
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_an_example_gives_the_same_results_inline_and_on_ray(
    ray_session, project, tmp_path, example
):
    path = quick_experiment(project, example, tmp_path)
    inline = run(path, tmp_path / "inline")
    remote = run(path, tmp_path / "ray", "runtime.executor=ray")
    pd.testing.assert_frame_equal(clients_of(inline), clients_of(remote))
    pd.testing.assert_frame_equal(rounds_of(inline), rounds_of(remote))
    assert clients_of(remote)["accuracy"].notna().all()


def submit_job(env, address: str, working_dir: Path, out: Path, *runtime_env: str):
    """`ray job submit` of the experiment job.yaml in `working_dir`, made quick; returns the
    finished process and the run directory it wrote."""
    quick = ["rounds=1", "seeds=[0]", "data.num_clients=4", "output.plots=false"]
    quick += ["data.partition.max_samples_per_client=60", f"output.dir={out}"]
    entrypoint = ["python", "-m", "raymtl", "run", "job.yaml", "runtime.address=auto", *quick]
    command = [RAY, "job", "submit", f"--address={address}", "--working-dir", str(working_dir)]
    for _ in range(10):  # a fresh head's job agent takes a while to come up
        result = subprocess.run(
            [*command, *runtime_env, "--", *entrypoint],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if "No available agent" not in result.stdout + result.stderr:
            break
        time.sleep(3)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    (run_dir,) = out.iterdir()
    return run_dir


def job_file(project: Path, folder: Path, plugin: str) -> None:
    """The FedAvgM example's experiment as `folder`/job.yaml, naming the plugin `plugin`."""
    raw = yaml.safe_load((project / "fedavgm" / "fedavgm_digits.yaml").read_text())
    raw["plugins"] = [plugin]
    (folder / "job.yaml").write_text(yaml.safe_dump(raw))


@pytest.mark.slow
@pytest.mark.cluster
def test_a_plugin_job_runs_on_a_head_from_working_dir_or_py_modules(
    token_head,  # noqa: F811 (the fixture imported above)
    project,
    tmp_path,
):
    """`ray job submit` as a user on a cluster: the plugin is a module of the job's
    working_dir (`plugins: [fedavgm]`), or of a package shipped by the runtime env's
    py_modules (`plugins: [user_plugins.fedavgm]`); the driver and every actor import it."""
    env, address = token_head
    job_file(project, project / "fedavgm", "fedavgm")
    package = tmp_path / "user_plugins"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copy(project / "fedavgm" / "fedavgm.py", package)
    jobs = tmp_path / "jobs"  # the experiment only: the plugin comes through py_modules
    jobs.mkdir()
    job_file(project, jobs, "user_plugins.fedavgm")
    modules = json.dumps({"py_modules": [str(package)]})
    runs = [
        submit_job(env, address, project / "fedavgm", tmp_path / "runs_wd"),
        submit_job(env, address, jobs, tmp_path / "runs_pm", "--runtime-env-json", modules),
    ]
    for run_dir, plugin in zip(runs, ["fedavgm", "user_plugins.fedavgm"], strict=True):
        config = yaml.safe_load((run_dir / "config.yaml").read_text())
        assert config["algorithm"]["name"] == "fedavgm" and config["plugins"] == [plugin]
        assert rounds_of(run_dir)["round"].tolist() == [1]
        assert (clients_of(run_dir)["bits_up"] > 0).sum() == 2  # ⌈0.5·4⌉ clients trained
    # The same module under two names, from two places: the same run.
    pd.testing.assert_frame_equal(clients_of(runs[0]), clients_of(runs[1]))


def test_a_plugin_gets_the_toolbox_for_free(project, tmp_path):
    """FedAvgM subclasses FedAvg and changes only its merge: the experiment's aggregation rule,
    uplink compression and attackers reach it without a line of its own; its velocity then
    acts on the rule's combination."""
    path = quick_experiment(project, "fedavgm", tmp_path)
    plain = clients_of(run(path, tmp_path / "plain", "algorithm.params.server_momentum=0"))
    toolbox = (
        "aggregation.rule=median",
        "compression.uplink.kind=sign",
        "attack.fraction=0.25",
        "algorithm.params.server_momentum=0",
    )
    robust = clients_of(run(path, tmp_path / "robust", *toolbox))
    assert not robust["loss"].equals(plain["loss"])
    assert (robust["bits_up"] < plain["bits_up"]).any()  # the sign codec's 32 + d per tensor
    # what it honours is FedAvg's declaration, inherited: a server optimiser is taken too
    assert load_config(path, ["server_optimizer.name=fedyogi"]).server_optimizer.name == "fedyogi"
