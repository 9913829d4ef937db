"""Reporter of leaders.parquet (ColNet, FedPer(I&C)): who led each task group, and the cost.

Rows: (seed, round, group, leader, next_leader, members, failover, aggregate_seconds,
weights), one per task group and aggregated round. Adds `summary["leaders"]`:
  rotations          rounds whose holder differs from the previous round's, over all groups
  distinct_leaders   per group, how many different members held the role (max over seeds)
  failovers          rounds in which a lost leader host was replaced (the next member led)
  aggregate_seconds  the leader's cross-group step (HCA for ColNet), mean per round and group
  bits_per_round     mean bits per aggregated round by message kind (intra-group backbones,
                     deltas between leaders, the leaders' broadcasts, announcements), counted
                     as the runtime counts them (hand-offs inside one client are not counted)
  bits_by_role       mean bits per round sent by members as members vs by the clients
                     holding a leadership, in that duty
and draws plots/leaders.png (the holder of each group's leadership per round, seed 0).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from raymtl.metrics.extras import table_plotter, table_reporter
from raymtl.metrics.figures import new_figure, save_figure
from raymtl.metrics.recorder import Recorder


def rotations(leaders: pd.DataFrame) -> int:
    """Changes of holder between consecutive rounds, summed over seeds and groups."""
    ordered = leaders.sort_values(["seed", "group", "round"])
    changed = ordered.groupby(["seed", "group"])["leader"].diff().fillna(0) != 0
    return int(changed.sum())


def counted_messages(run_dir: Path) -> pd.DataFrame:
    """The messages that crossed a link (a client's hand-off to its own role did not)."""
    messages = Recorder.load(run_dir).messages()
    same_machine = messages["src_client"].notna() & (
        messages["src_client"] == messages["dst_client"]
    )
    return messages[~same_machine]


def bits_summary(run_dir: Path, leaders: pd.DataFrame) -> dict:
    messages = counted_messages(run_dir)
    aggregated = leaders[["seed", "round"]].drop_duplicates()
    if messages.empty or aggregated.empty:
        return {}
    rounds = len(aggregated)
    by_kind = (messages.groupby("kind")["bits"].sum() / rounds).to_dict()
    as_leader = messages["src_role"] == "leader"
    by_role = {
        "member": float(messages.loc[~as_leader, "bits"].sum() / rounds),
        "leader_duty": float(messages.loc[as_leader, "bits"].sum() / rounds),
    }
    return {"bits_per_round": {k: float(v) for k, v in by_kind.items()}, "bits_by_role": by_role}


def plot_holders(leaders: pd.DataFrame, path: Path) -> Path:
    figure = new_figure(figsize=(6, 3))
    axes = figure.subplots()
    first_seed = leaders[leaders["seed"] == leaders["seed"].min()]
    for group, rows in first_seed.groupby("group"):
        axes.step(rows["round"], rows["leader"], where="mid", marker="o", label=f"group {group}")
    axes.set_xlabel("round")
    axes.set_ylabel("client holding the leadership")
    axes.set_title("Task leaders over rounds")
    axes.legend()
    return save_figure(figure, path)


@table_reporter("leaders")
def report_leaders(run_dir: Path, summary: dict) -> None:
    leaders = pd.read_parquet(Path(run_dir) / "leaders.parquet")
    if leaders.empty:
        return
    distinct = leaders.groupby(["seed", "group"])["leader"].nunique().groupby("group").max()
    summary["leaders"] = {
        "rotations": rotations(leaders),
        "distinct_leaders": {str(g): int(n) for g, n in distinct.items()},
        "failovers": int(leaders["failover"].sum()),
        "aggregate_seconds": float(leaders["aggregate_seconds"].mean()),
        **bits_summary(run_dir, leaders),
    }


@table_plotter("leaders")
def plot_leaders(run_dir: Path) -> list[Path]:
    leaders = pd.read_parquet(Path(run_dir) / "leaders.parquet")
    if leaders.empty:
        return []
    return [plot_holders(leaders, Path(run_dir) / "plots" / "leaders.png")]
