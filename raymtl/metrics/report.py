"""Final-round summaries of runs (summary.json), the results table and ``raymtl report``."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import yaml
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

from raymtl.metrics.costs import (
    LOWER_IS_BETTER,
    format_bytes,
    peak_memory_summary,
    target_summary,
)
from raymtl.metrics.divergence import diverged_seeds, divergence_note, first_non_finite_round
from raymtl.metrics.plots import plot_run
from raymtl.metrics.recorder import Recorder
from raymtl.metrics.statistics import evaluated_rounds, is_number, mean_and_std, without_nan
from raymtl.metrics.tables import report_extra_tables
from raymtl.metrics.tasks import has_tasks, task_summary, task_table

ACCURACY_METRICS = ("mean_accuracy", "worst10_accuracy", "worst20_accuracy", "std_accuracy")
# Summary key -> rounds column, read at the seed's last recorded round (the whole run's cost).
COST_METRICS = {
    "total_bits_up": "cum_bits_up",
    "total_bits_down": "cum_bits_down",
    "total_bits": "cum_bits",
    "wall_time": "wall_time",
}
# total_flops: raymtl/flops.py, absent from runs recorded before it.
# epsilon: client-level DP's ε at the seed's last round (privacy.clip; absent without it).
SUMMARY_METRICS = (
    ACCURACY_METRICS + tuple(COST_METRICS) + ("total_flops", "client_updates_per_second", "epsilon")
)
BIT_UNITS = ("b", "Kb", "Mb", "Gb", "Tb", "Pb")
# The results table's columns in the order they are left out of a terminal too narrow for
# them all (summary.json and table.csv keep every figure); the experiment, Acc %, Bits and
# Faults stay.
RESULTS_DROP_ORDER = (
    "Worst20 %",
    "Seeds",
    "Std %",
    "Peak mem",
    "Worst10 %",
    "TFLOPs to target",
    "Time",
    "TFLOPs",
    "Bits to target",
    "Rounds to target",
)
UNBOUNDED = 100_000  # a width that measures a table's cells as they are, unwrapped


def seed_summary(seed: int, seed_rounds: pd.DataFrame) -> dict | None:
    """Final metrics of one seed: accuracies at the last evaluated round, cost at the last round.

    Returns None when the seed has no evaluated round yet. A seed whose loss turned NaN or
    ±inf says from which round (`diverged_from`); when its last evaluated loss is not a
    number its accuracies are None (divergence.py), its cost figures are as for any seed.
    """
    evaluated = evaluated_rounds(seed_rounds)
    if evaluated.empty:
        return None
    final_eval = evaluated.loc[evaluated["round"].idxmax()]
    last_row = seed_rounds.loc[seed_rounds["round"].idxmax()]
    summary = {"seed": int(seed), "round": int(final_eval["round"])}
    usable = is_number(float(final_eval["mean_loss"]))
    summary.update(
        {metric: float(final_eval[metric]) if usable else None for metric in ACCURACY_METRICS}
    )
    covered = final_eval.get("clients_evaluated")  # eval_fraction: the figures' clients
    if covered is not None and not pd.isna(covered):
        summary["clients_evaluated"] = int(covered)
    diverged_from = first_non_finite_round(seed_rounds)
    if diverged_from is not None:
        summary["diverged_from"] = diverged_from
    summary.update({key: float(last_row[column]) for key, column in COST_METRICS.items()})
    flops = last_row.get("cum_flops")  # raymtl/flops.py; absent from runs recorded before it
    if flops is not None and not math.isnan(flops):
        summary["total_flops"] = float(flops)
    epsilon = last_row.get("epsilon")  # client-level DP only
    if epsilon is not None and not pd.isna(epsilon):
        summary["epsilon"] = float(epsilon)
    # Throughput: local updates over the seed's wall time (rounds only; NaN for old runs).
    trained = seed_rounds.get("clients_trained")
    if trained is not None and trained.notna().any():
        wall = max(float(last_row["wall_time"]), 1e-9)
        summary["client_updates_per_second"] = float(trained.sum()) / wall
    return summary


def summarize(run_dir: Path, algorithm: str, config: dict | None = None) -> dict:
    """Summarize a run's final round per seed and across seeds; also writes summary.json.

    Seeds without any evaluated round are left out. Across-seed std is population std, over
    the seeds whose figure is a number. `diverged` lists the seeds whose loss turned NaN or
    ±inf (divergence.py; empty when none did). `config`: the run's configuration as a
    mapping (default: its config.yaml); its `metrics.target` adds the cost of reaching the
    target (`target`), and hosts.parquet the peak memory of the run's processes
    (`peak_memory`). NaN figures are written (and returned) as None: JSON's null.
    """
    run_dir = Path(run_dir)
    config = run_config(run_dir) if config is None else config
    recorder = Recorder.load(run_dir)
    rounds = recorder.rounds()
    per_seed = []
    for seed, seed_rounds in rounds.groupby("seed"):
        seed_result = seed_summary(int(seed), seed_rounds)
        if seed_result is not None:
            per_seed.append(seed_result)
    clients = recorder.clients()
    summary = {
        "algorithm": algorithm,
        "seeds": [row["seed"] for row in per_seed],
        "diverged": diverged_seeds(rounds, clients, recorder.table("warnings")),
        "final": {
            metric: mean_and_std([row[metric] for row in per_seed])
            for metric in SUMMARY_METRICS
            if all(metric in row for row in per_seed)  # older runs lack the newer figures
        },
        "per_seed": per_seed,
    }
    num_clients = (config.get("data") or {}).get("num_clients")
    if num_clients is not None:
        summary["num_clients"] = int(num_clients)  # what clients_evaluated is out of
    metrics = config.get("metrics") or {}
    if metrics.get("target") is not None:
        metric = metrics.get("metric", "mean_accuracy")
        summary["target"] = target_summary(rounds, summary["seeds"], metric, metrics["target"])
    one_process = (config.get("runtime") or {}).get("executor") == "inline"
    peak_memory = peak_memory_summary(recorder.table("hosts"), summary["seeds"], one_process)
    if peak_memory is not None:
        summary["peak_memory"] = peak_memory
    privacy = privacy_summary(config, summary)
    if privacy is not None:
        summary["epsilon"], summary["privacy"] = privacy["epsilon"], privacy
    if has_tasks(clients):
        summary["tasks"] = task_summary(clients)
    report_extra_tables(run_dir, summary)  # algorithm tables add their own figures
    summary = without_nan(summary)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def privacy_summary(config: dict, summary: dict) -> dict | None:
    """The ε reached (the largest over seeds: they differ only with local noise), at which δ
    and by which accounting (docs/ALGORITHMS.md §9.3); None without client-level DP."""
    privacy = config.get("privacy") or {}
    epsilons = [row["epsilon"] for row in summary["per_seed"] if "epsilon" in row]
    if privacy.get("clip") is None or not epsilons:
        return None
    from raymtl.toolbox.accounting import LOCAL_ACCOUNTING, accounting_name
    from raymtl.toolbox.privacy import default_delta

    population = (config.get("data") or {}).get("num_clients", 1)
    sampling = config.get("sampling", "uniform")
    if privacy.get("noise") == "local":  # each client's own releases: nothing sampled
        accounting, note = LOCAL_ACCOUNTING, ""
    else:
        accounting = accounting_name(privacy.get("accounting", "poisson"))
        note = ""
        if privacy.get("accounting", "poisson") == "poisson":
            poisson = sampling == "poisson"
            note = "exact" if poisson else "approximation for fixed-size cohorts"
    return {
        "epsilon": max(epsilons),
        "delta": privacy.get("delta") or default_delta(population),
        "accounting": accounting,
        "sampling": sampling,
        "note": note,
        "noise": privacy.get("noise", "server"),
        "clipping": privacy.get("clipping", "fixed"),
    }


def format_epsilon(epsilon: float | None) -> str:
    """ε as the table shows it: '-' without DP, '∞' without noise."""
    if epsilon is None:
        return "-"
    return "∞" if math.isinf(epsilon) else f"{epsilon:.3g}"


def missing(value: float | None) -> bool:
    """A figure summary.json has not: None (JSON's null) or NaN."""
    return value is None or math.isnan(value)


def format_bits(bits: float | None) -> str:
    """Human-readable bit count with decimal prefixes, e.g. 12300000 -> '12.3 Mb'."""
    if missing(bits):
        return "-"
    unit_index = 0
    while abs(bits) >= 1000 and unit_index < len(BIT_UNITS) - 1:
        bits /= 1000
        unit_index += 1
    if unit_index == 0:
        return f"{bits:.0f} b"
    return f"{bits:.1f} {BIT_UNITS[unit_index]}"


def format_percent(stat: dict[str, float | None]) -> str:
    """'mean ± std' of a [0, 1] quantity, shown in percent."""
    if missing(stat["mean"]):
        return "-"
    return f"{100 * stat['mean']:.1f}±{100 * stat['std']:.1f}"


def format_seconds(seconds: float | None) -> str:
    """Wall time as seconds, or minutes and seconds beyond a minute."""
    if missing(seconds):
        return "-"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, remainder = divmod(seconds, 60)
    return f"{int(minutes)} m {remainder:04.1f} s"


def reached_share(target: dict) -> str:
    """' (k/n seeds)' when only some seeds reached the target; '' when all did."""
    if target["seeds_reached"] == target["seeds"]:
        return ""
    return f" ({target['seeds_reached']}/{target['seeds']} seeds)"


def format_rounds_to_target(target: dict | None) -> str:
    """Rounds to the target, mean ± std over the seeds that reached it."""
    if target is None:
        return "-"
    if target["rounds"] is None:
        return "not reached"
    rounds = target["rounds"]
    return f"{rounds['mean']:.1f}±{rounds['std']:.1f}{reached_share(target)}"


def format_bits_to_target(target: dict | None) -> str:
    """Bits sent until the target was reached, mean over the seeds that reached it."""
    if target is None:
        return "-"
    if target["bits"] is None:
        return "not reached"
    return f"{format_bits(target['bits']['mean'])}{reached_share(target)}"


def format_tflops(flops: float | None) -> str:
    """FLOPs in TFLOPs with three significant digits ('-' when unknown): 2.5e12 -> '2.50'."""
    if missing(flops):
        return "-"
    return f"{flops / 1e12:.3g}"


def format_flops_to_target(target: dict | None) -> str:
    """TFLOPs spent until the target was reached, mean over the seeds that reached it."""
    if target is None:
        return "-"
    if target.get("flops") is None:
        return "not reached" if target["rounds"] is None else "-"
    return f"{format_tflops(target['flops']['mean'])}{reached_share(target)}"


def target_caption(summaries: list[dict]) -> str | None:
    """'target: mean_accuracy >= 0.8' (one line per distinct target), then the seeds that
    diverged (`divergence_note`), or None."""
    targets = {(s["target"]["metric"], s["target"]["target"]) for s in summaries if "target" in s}
    lines = [
        f"target: {metric} {'<=' if metric in LOWER_IS_BETTER else '>='} {value:g}"
        for metric, value in sorted(targets)
    ]
    note = divergence_note(summaries)
    return "\n".join([*lines, *coverage_notes(summaries), *([note] if note else [])]) or None


def coverage_notes(summaries: list[dict]) -> list[str]:
    """'fedavg: accuracy over 1,000 clients (eval_fraction)' where the final figures cover a
    sample of the clients, not all of them."""
    notes = []
    for summary in summaries:
        covered = {s.get("clients_evaluated") for s in summary.get("per_seed", [])}
        total = summary.get("num_clients")
        covered.discard(None)
        if covered and total and max(covered) < total:
            counts = "/".join(f"{count:,}" for count in sorted(covered))
            notes.append(
                f"{summary['algorithm']}: accuracy over {counts} of {total:,} clients "
                "(eval_fraction)"
            )
    return notes


def format_accuracy(summary: dict) -> str:
    """The Acc % cell: 'mean ± std'; 'diverged' where no seed has an accuracy because their
    losses turned NaN (the caption says which seeds, from which round)."""
    stat = summary["final"]["mean_accuracy"]
    if missing(stat["mean"]) and summary.get("diverged"):
        return "diverged"
    return format_percent(stat)


def results_table(summaries: list[dict], title: str) -> Table:
    """One row per algorithm: accuracies (%, mean ± std over seeds), total bits, wall time,
    the peak memory of the run's processes, TFLOPs and, with `metrics.target`, the rounds,
    bits and TFLOPs to reach the target. Seeds whose losses turned NaN are named under it."""
    table = Table(title=title, title_justify="left", caption=target_caption(summaries))
    table.add_column("Experiment", style="bold", no_wrap=True)
    for header in ("Seeds", "Acc %", "Worst10 %", "Worst20 %", "Std %"):
        table.add_column(header, justify="right", no_wrap=True)
    table.add_column("Bits", justify="right", no_wrap=True)
    table.add_column("Time", justify="right", no_wrap=True)
    with_memory = any("peak_memory" in summary for summary in summaries)
    if with_memory:  # the sum over the run's processes, mean over seeds
        table.add_column("Peak mem", justify="right", no_wrap=True)
    table.add_column("TFLOPs", justify="right", no_wrap=True)
    with_target = any("target" in summary for summary in summaries)
    if with_target:
        table.add_column("Rounds to target", justify="right", no_wrap=True)
        table.add_column("Bits to target", justify="right", no_wrap=True)
        table.add_column("TFLOPs to target", justify="right", no_wrap=True)
    private = any("epsilon" in summary for summary in summaries)
    if private:  # client-level DP: the ε reached at the run's δ
        table.add_column("ε", justify="right", no_wrap=True)
    faulty = any("faults" in summary for summary in summaries)
    if faulty:  # lost hosts: each a roll-back to the last checkpoint and a replay
        table.add_column("Faults", justify="right", no_wrap=True)
    for summary in summaries:
        final = summary["final"]
        faults = summary.get("faults", {})
        recovered = f"{faults.get('recoveries', 0)} ({faults.get('rounds_replayed', 0)} replayed)"
        peak_memory = summary.get("peak_memory")
        memory = format_bytes(peak_memory["total_bytes"]["mean"]) if peak_memory else "-"
        target = summary.get("target")
        to_target = [
            format_rounds_to_target(target),
            format_bits_to_target(target),
            format_flops_to_target(target),
        ]
        total_flops = final.get("total_flops", {"mean": math.nan})["mean"]
        table.add_row(
            summary["algorithm"],
            str(len(summary["seeds"])),
            format_accuracy(summary),
            format_percent(final["worst10_accuracy"]),
            format_percent(final["worst20_accuracy"]),
            format_percent(final["std_accuracy"]),
            format_bits(final["total_bits"]["mean"]),
            format_seconds(final["wall_time"]["mean"]),
            *([memory] if with_memory else []),
            format_tflops(total_flops),
            *(to_target if with_target else []),
            *([format_epsilon(summary.get("epsilon"))] if private else []),
            *([recovered] if faulty else []),
        )
    return table


def fit_table(table: Table, console: Console, drop_order: Sequence[str] = ()) -> Table:
    """`table` as it fits `console`'s width with no word cut: unchanged when it fits as it
    is; else each column as wide as its longest value (values never wrap) and its longest
    header word (headers wrap between words), the room left given to the columns from the
    left; when even that is too wide, columns are left out, those of `drop_order` (headers)
    first, then from the right (never the first), and the caption names them."""
    width, wide = console.width, console.options.update_width(UNBOUNDED)
    if Measurement.get(console, wide, table).maximum <= width:
        return table
    bodies = [list(column.cells) for column in table.columns]
    limits = []  # (narrowest, widest) of each column's text
    for column, cells in zip(table.columns, bodies, strict=True):
        header = Measurement.get(console, wide, column.header)
        values = [Measurement.get(console, wide, cell).maximum for cell in cells]
        limits.append((max([header.minimum, *values]), max([header.maximum, *values])))
    headers = [str(column.header) for column in table.columns]
    order = [headers.index(h) for h in drop_order if h in headers[1:]]
    order += [i for i in reversed(range(1, len(headers))) if i not in order]

    def room(kept: list[int]) -> int:
        """The console's width less what the table adds to its columns' text (borders,
        padding), minus the narrowest its `kept` columns can be: < 0 does not fit."""
        overhead = Measurement.get(console, wide, rebuilt(table, bodies, kept)).maximum - sum(
            limits[i][1] for i in kept
        )
        return width - overhead - sum(limits[i][0] for i in kept)

    kept, left_out = list(range(len(headers))), []
    while room(kept) < 0 and order:
        left_out.append(order.pop(0))
        kept.remove(left_out[-1])
    for index in reversed(left_out[:-1]):  # one left out early may fit beside those kept
        if room(sorted([*kept, index])) >= 0:
            kept = sorted([*kept, index])
    widths, spare = [], room(kept)
    fits = spare >= 0
    for i in kept:
        grown = min(limits[i][1], limits[i][0] + max(spare, 0))
        spare -= grown - limits[i][0]
        widths.append(grown)
    fitted = rebuilt(table, bodies, kept, widths if fits else None)
    if len(kept) < len(headers):
        shown = ", ".join(headers[i] for i in range(len(headers)) if i not in kept)
        note = f"not shown at {width} columns: {shown}"
        fitted.caption = f"{table.caption}\n{note}" if table.caption else note
    return fitted


def rebuilt(
    table: Table, bodies: list[list], kept: list[int], widths: list[int] | None = None
) -> Table:
    """A copy of `table` (title, caption, box, rows' styles) with the columns `kept`, of
    `widths` (None: as wide as their text), wrapping between words."""
    copied = copy.copy(table)
    copied.columns, copied.rows = [], []
    for position, index in enumerate(kept):
        column = table.columns[index]
        copied.add_column(
            column.header,
            header_style=column.header_style,
            style=column.style,
            justify=column.justify,
            vertical=column.vertical,
            overflow="fold",
            width=None if widths is None else widths[position],
            no_wrap=False,
        )
    for number, row in enumerate(table.rows):
        cells = [bodies[index][number] for index in kept]
        copied.add_row(*cells, style=row.style, end_section=row.end_section)
    return copied


def run_config(run_dir: Path) -> dict:
    """The run's config.yaml as a mapping (empty when it has none)."""
    config_path = Path(run_dir) / "config.yaml"
    if not config_path.exists():
        return {}
    config = yaml.safe_load(config_path.read_text())
    return config if isinstance(config, dict) else {}


def algorithm_name(run_dir: Path) -> str:
    """``algorithm.name`` from the run's config.yaml (the folder name if it is not there)."""
    config = run_config(run_dir)
    if not config:
        return Path(run_dir).name
    algorithm = config.get("algorithm", {})
    # Tolerate ``algorithm: name`` as well as ``algorithm: {name: ...}``.
    if isinstance(algorithm, str):
        return algorithm
    return str(algorithm.get("name", Path(run_dir).name))


def report(run_dir: Path, console: Console | None = None) -> dict:
    """Re-draw a run's plots, write summary.json and print its results table (`raymtl report`).

    Returns the summary, with the written plot paths under ``"plots"``.
    """
    run_dir = Path(run_dir)
    summary = summarize(run_dir, algorithm_name(run_dir))
    plot_paths = plot_run(run_dir)
    print_summary(summary, f"Results: {run_dir}", console or Console(), plot_paths)
    return {**summary, "plots": [str(path) for path in plot_paths]}


def print_summary(summary: dict, title: str, console: Console, plot_paths: list[Path] = ()) -> None:
    """A run's results table (and its per-task table), then the plots it has; the tables
    fitted to the console's width (`fit_table`)."""
    console.print(fit_table(results_table([summary], title=title), console, RESULTS_DROP_ORDER))
    if summary.get("tasks"):
        console.print(fit_table(task_table([summary], title="Per task"), console))
    for path in plot_paths:
        console.print(f"plot: {path}")
