"""FedMuscle's M = 1, 2, 3 against downlink bits: Δ% vs Local from two comparisons.

    python results/scripts/fedmuscle_partners.py runs/fedmuscle_main runs/fedmuscle_partners

The first directory is `raymtl compare jobs/fedmuscle_fmnist.yaml
"algorithm.name=fedmuscle,pairwise_infonce,local" --out ...` (its fedmuscle arm is M = 3, its
local arm the reference); the second `raymtl compare jobs/fedmuscle_fmnist.yaml
"algorithm.params.partners=1,2" --out ...`. Prints a Markdown table and writes
results/fedmuscle_partners.png (Δ% mean ± std over seeds vs downlink bits per client and round).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from raymtl.metrics.delta import client_finals, delta_summary, relative_gains
from raymtl.metrics.recorder import Recorder

DOWNLINK_KINDS = ("tuples", "partners", "public_batch")


def arm_dirs(main: Path, partners: Path) -> dict[str, Path]:
    arms = {}
    for directory in sorted(partners.iterdir()):
        suffix = directory.name.rsplit("-", 1)[-1]  # compare names arms <file>-<value>
        if directory.is_dir() and suffix.isdigit():
            arms[f"fedmuscle M={suffix}"] = directory
    arms["fedmuscle M=3"] = next(main.glob("*-fedmuscle"))
    arms["pairwise_infonce (all)"] = next(main.glob("*-pairwise_infonce"))
    return arms


def downlink_per_client_round(run_dir: Path) -> float:
    """Mean bits a client receives per round (the server's sends to it)."""
    messages = pd.read_parquet(run_dir / "messages.parquet")
    down = messages[messages["kind"].isin(DOWNLINK_KINDS)]
    per_round = down.groupby(["seed", "round"])["bits"].sum()
    return float(per_round.mean() / down["dst"].nunique())


def main(main_dir: str, partners_dir: str) -> None:
    main_path, partners_path = Path(main_dir), Path(partners_dir)
    reference = client_finals(Recorder.load(next(main_path.glob("*-local"))).clients())
    rows = []
    for arm, run_dir in arm_dirs(main_path, partners_path).items():
        gains = relative_gains(client_finals(Recorder.load(run_dir).clients()), reference)
        delta = delta_summary(gains)["delta_percent"]
        rows.append({"arm": arm, "downlink_bits": downlink_per_client_round(run_dir), **delta})
    table = pd.DataFrame(rows)
    print("| arm | downlink per client and round | Δ% vs Local |\n|---|---|---|")
    for row in table.itertuples():
        megabytes = row.downlink_bits / 8e6
        print(f"| {row.arm} | {megabytes:,.2f} MB | {row.mean:+.1f} ± {row.std:.1f} |")
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.subplots()
    for row in table.itertuples():
        axes.errorbar(row.downlink_bits, row.mean, yerr=row.std, fmt="o", capsize=3)
        axes.annotate(row.arm, (row.downlink_bits, row.mean), textcoords="offset points",
                      xytext=(5, 5), fontsize=8)  # fmt: skip
    axes.axhline(0, color="grey", linewidth=0.8)
    axes.set_xscale("log")
    axes.set_xlabel("downlink bits per client and round")
    axes.set_ylabel("Δ% vs Local (mean ± std over seeds)")
    axes.set_title("FedMuscle: partners M vs downlink")
    out = Path(__file__).resolve().parents[1] / "fedmuscle_partners.png"
    figure.savefig(out, dpi=120)
    print(f"plot: {out}")


if __name__ == "__main__":
    main(*sys.argv[1:3])
