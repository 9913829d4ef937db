"""A run whose losses turn NaN: summary.json and the results table say which seed, from which
round; bits, times and FLOPs stay numbers; summary.json holds no bare NaN; the steps'
warnings reach the console once per seed, not once per round (and not twice inline)."""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from rich.console import Console

from raymtl.api.comparison import final_table
from raymtl.metrics import Recorder, results_table, summarize
from raymtl.metrics.statistics import evaluated_rounds, mean_and_std, without_nan
from raymtl.runtime.hosts.step_warnings import AlgorithmWarnings
from raymtl.runtime.loop.round_loop import RoundLoop

NAN = float("nan")
REJECTED = "rejected a non-finite update (not aggregated)"


def round_row(seed: int, round_: int, accuracy: float, loss: float) -> dict:
    """An evaluated round: cumulative bits 1000·r, 2·r TFLOPs, wall time 2·r seconds."""
    return {
        "seed": seed,
        "round": round_,
        "mean_accuracy": accuracy,
        "worst10_accuracy": accuracy - 0.2,
        "worst20_accuracy": accuracy - 0.1,
        "std_accuracy": 0.05,
        "mean_loss": loss,
        "bits_up": 500,
        "bits_down": 500,
        "cum_bits_up": 500 * round_,
        "cum_bits_down": 500 * round_,
        "cum_bits": 1000 * round_,
        "seconds_evaluate": 0.01,
        "clients_trained": 3,
        "flops": 2e12,
        "cum_flops": 2e12 * round_,
        "wall_time": 2.0 * round_,
    }


def client_rows(seed: int, round_: int, loss: float, accuracy: float) -> list[dict]:
    return [
        {
            "seed": seed,
            "round": round_,
            "client": client,
            "loss": loss,
            "accuracy": accuracy,
            "samples": 10,
            "test_samples": 5,
            "group": 0,
            "task": 0,
            "bits_up": 100,
            "bits_down": 100,
        }
        for client in range(3)
    ]


def write_run(run_dir: Path, nan_from: dict[int, int], rejected_from: dict[int, int]) -> Path:
    """Seeds 0 and 1, rounds 1..4, every round evaluated; seed s's losses (rounds.parquet's
    and every client's) are NaN from round nan_from[s]; from round rejected_from[s] the server
    rejects 3 non-finite updates a round (warnings.parquet, as round_loop.py records them)."""
    recorder = Recorder(run_dir)
    for seed in (0, 1):
        for round_ in range(1, 5):
            diverged = round_ >= nan_from.get(seed, 99)
            accuracy = 0.1 if diverged else 0.5 + 0.1 * round_ + 0.05 * seed
            loss = NAN if diverged else 1.0 / round_
            recorder.add_round(round_row(seed, round_, accuracy, loss))
            recorder.add_clients(client_rows(seed, round_, loss, accuracy))
            if round_ >= rejected_from.get(seed, 99):
                warning = {"seed": seed, "round": round_, "participant": "server"}
                warning |= {"step": "aggregate", "message": REJECTED}
                recorder.add_rows("warnings", [warning] * 3)
    recorder.flush()
    (run_dir / "config.yaml").write_text("algorithm:\n  name: fedavg\n")
    return run_dir


def strict_json(path: Path):
    """The file as JSON, refusing NaN and Infinity (what a strict JSON reader does)."""

    def refuse(constant):
        raise ValueError(f"bare {constant} in {path.name}")

    return json.loads(path.read_text(), parse_constant=refuse)


def render(table) -> str:
    console = Console(record=True, width=200)
    console.print(table)
    return console.export_text()


def caption(text: str) -> str:
    """The rendered table's text on one line (the caption wraps at the table's width)."""
    return " ".join(text.split())


@pytest.fixture
def seed1_diverged(tmp_path: Path) -> Path:
    """Seed 1's loss turns NaN from round 3, its updates are rejected from round 3 too."""
    return write_run(tmp_path / "run", nan_from={1: 3}, rejected_from={1: 3})


def test_summary_names_the_seed_and_round_where_the_loss_turned_nan(seed1_diverged: Path):
    summary = summarize(seed1_diverged, "fedavg")
    assert summary["seeds"] == [0, 1]  # both ran: both counted
    (entry,) = summary["diverged"]
    assert entry["seed"] == 1 and entry["round"] == 3 and entry["test_loss_from"] == 3
    assert entry["test_loss"] == "NaN" and (entry["clients"], entry["of"]) == (3, 3)
    assert entry["rounds"] == 2  # rounds 3 and 4
    assert entry["updates_rejected_from"] == 3 and entry["updates_rejected"] == 2 * 3
    assert "test loss NaN" in entry["what"]
    assert strict_json(seed1_diverged / "summary.json") == summary


def test_costs_stay_numbers_and_accuracy_is_over_the_finite_seeds(seed1_diverged: Path):
    summary = summarize(seed1_diverged, "fedavg")
    final = summary["final"]
    for figure in ("total_bits", "total_bits_up", "wall_time", "total_flops"):
        assert math.isfinite(final[figure]["mean"]) and math.isfinite(final[figure]["std"])
    assert final["total_bits"] == {"mean": 4000.0, "std": 0.0}
    assert final["wall_time"]["mean"] == pytest.approx(8.0)
    assert final["total_flops"]["mean"] == pytest.approx(8e12)
    # Seed 0's final accuracy (0.9) only: seed 1's outputs are NaN at its last round.
    assert final["mean_accuracy"] == {"mean": pytest.approx(0.9), "std": 0.0}
    seed0, seed1 = summary["per_seed"]
    assert seed0["mean_accuracy"] == pytest.approx(0.9) and "diverged_from" not in seed0
    assert seed1["round"] == 4 and seed1["mean_accuracy"] is None
    assert seed1["diverged_from"] == 3 and seed1["total_bits"] == 4000.0


def test_the_table_says_which_seed_diverged_from_which_round(seed1_diverged: Path):
    text = render(results_table([summarize(seed1_diverged, "fedavg")], title="Results"))
    assert "fedavg diverged: seed 1 from round 3" in caption(text)
    assert "6 non-finite updates rejected, test loss NaN at 3/3 clients" in caption(text)
    assert "accuracy over the other seeds (seed 1 left out)" in caption(text)
    row = next(line for line in text.splitlines() if line.startswith("│ fedavg"))
    cells = [cell.strip() for cell in row.strip("│").split("│")]
    assert cells[:3] == ["fedavg", "2", "90.0±0.0"]  # both seeds ran; seed 0's accuracy
    assert "4.0 Kb" in cells and "8.0 s" in cells and "-" not in cells[6:8]


def test_every_seed_nan_from_the_first_round(tmp_path: Path):
    """The user's report: losses NaN from round 1 gave 'Seeds 0', '-' everywhere and NaN
    bits and wall time in summary.json."""
    run_dir = write_run(tmp_path / "run", nan_from={0: 1, 1: 1}, rejected_from={})
    summary = summarize(run_dir, "fedavg")
    written = strict_json(run_dir / "summary.json")
    assert written == summary and written["seeds"] == [0, 1]
    assert [(e["seed"], e["round"]) for e in written["diverged"]] == [(0, 1), (1, 1)]
    assert written["final"]["mean_accuracy"] == {"mean": None, "std": None}
    assert written["final"]["total_bits"] == {"mean": 4000.0, "std": 0.0}
    assert written["final"]["wall_time"]["mean"] == pytest.approx(8.0)
    text = render(results_table([written], title="Results"))
    row = next(line for line in text.splitlines() if line.startswith("│ fedavg"))
    cells = [cell.strip() for cell in row.strip("│").split("│")]
    assert cells[:3] == ["fedavg", "2", "diverged"]
    assert "4.0 Kb" in cells and "8.0 s" in cells
    assert "seed 0 from round 1 (test loss NaN at 3/3 clients)" in caption(text)
    assert "no accuracy" in caption(text)


def test_updates_rejected_without_a_nan_loss_is_named_and_keeps_its_accuracy(tmp_path: Path):
    """Every update rejected from round 2: the server keeps its model, whose loss stays a
    number; the seed is named (its training diverged), its accuracy is that model's."""
    run_dir = write_run(tmp_path / "run", nan_from={}, rejected_from={0: 2})
    summary = summarize(run_dir, "fedavg")
    (entry,) = summary["diverged"]
    assert entry["seed"] == 0 and entry["round"] == 2 and "test_loss_from" not in entry
    assert summary["per_seed"][0]["mean_accuracy"] == pytest.approx(0.9)
    text = render(results_table([summary], title="Results"))
    assert "fedavg diverged: seed 0 from round 2 (9 non-finite updates rejected)" in caption(text)


def test_a_run_without_divergence_has_an_empty_list_and_no_note(tmp_path: Path):
    run_dir = write_run(tmp_path / "run", nan_from={}, rejected_from={})
    summary = summarize(run_dir, "fedavg")
    assert summary["diverged"] == []
    assert "diverged" not in render(results_table([summary], title="Results"))
    assert "diverged" not in final_table([summary]).columns


def test_table_csv_has_a_diverged_column(seed1_diverged: Path, tmp_path: Path):
    healthy = summarize(write_run(tmp_path / "ok", nan_from={}, rejected_from={}), "ok")
    table = final_table([summarize(seed1_diverged, "fedavg"), healthy])
    assert table["diverged"].tolist() == ["seed 1 from round 3", ""]
    assert table["total_bits_mean"].tolist() == [4000.0, 4000.0]


def test_nan_rounds_count_as_evaluated_and_old_runs_still_read():
    import pandas as pd

    rows = pd.DataFrame(
        {
            "round": [1, 2, 3],
            "mean_loss": [0.5, NAN, NAN],
            "seconds_evaluate": [0.1, 0.1, NAN],  # round 3: not evaluated
        }
    )
    assert evaluated_rounds(rows)["round"].tolist() == [1, 2]
    legacy = rows.drop(columns="seconds_evaluate")  # before seconds_evaluate was recorded
    assert evaluated_rounds(legacy)["round"].tolist() == [1]


def test_mean_and_std_skip_nan_and_none_and_without_nan_keeps_inf():
    assert mean_and_std([0.5, NAN, None, 0.7]) == pytest.approx({"mean": 0.6, "std": 0.1})
    assert all(math.isnan(v) for v in mean_and_std([NAN, None]).values())
    cleaned = without_nan({"a": NAN, "b": [1.0, NAN], "eps": math.inf, "s": "NaN"})
    assert cleaned == {"a": None, "b": [1.0, None], "eps": math.inf, "s": "NaN"}


def test_a_steps_warning_is_collected_not_printed_again():
    """Inline, the hosts run in the driver's process: a step's warning goes to the host's
    collector only (round_loop.py prints its summary line), not to the root's handlers too."""
    seen: list[str] = []

    class Seen(logging.Handler):
        def emit(self, record):
            seen.append(record.getMessage())

    root, handler = logging.getLogger(), Seen(level=logging.DEBUG)
    root.addHandler(handler)
    log = logging.getLogger("raymtl.algorithms.aggregate")
    try:
        with AlgorithmWarnings() as warned:
            log.warning(REJECTED)
        assert warned.messages == [REJECTED] and seen == []
        assert logging.getLogger("raymtl.algorithms").propagate  # restored
        log.warning("outside a step")
        assert seen == ["outside a step"]
    finally:
        root.removeHandler(handler)


def test_a_warning_is_printed_once_per_seed(caplog):
    loop = RoundLoop.__new__(RoundLoop)  # only what print_warnings reads
    loop.cfg, loop.seed, loop.printed = SimpleNamespace(name="exp"), 1, set()
    with caplog.at_level(logging.WARNING, logger="raymtl.runtime.loop.round_loop"):
        for round_index in (2, 3, 4):
            loop.print_warnings(round_index, Counter({("server", REJECTED): 5}))
    lines = [r.getMessage() for r in caplog.records if r.name.endswith("round_loop")]
    assert len(lines) == 1
    assert lines[0].startswith(f"exp seed 1 round 2, server: {REJECTED} (x5;")
