"""The Shakespeare page's table and figure (results/shakespeare.md) from `raymtl compare`
folders of jobs/leaf/shakespeare_twin.yaml.

    python results/scripts/shakespeare.py runs/shakespeare/small    # table; results/*.png

Each arm's rounds.parquet gives the evaluated rounds' mean and worst-10 % accuracy and the
mean test loss; the figure is accuracy against the round.
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1]


def main(folder: Path) -> None:
    figure, axis = plt.subplots(figsize=(5.5, 3.5))
    print("| arm | round | mean acc % | worst-10 % acc % | mean test loss |")
    print("|---|---|---|---|---|")
    for arm in sorted(p for p in folder.iterdir() if (p / "rounds.parquet").is_file()):
        rounds = pd.read_parquet(arm / "rounds.parquet")
        rounds = rounds[rounds["mean_accuracy"].notna()]
        name = arm.name.removeprefix("shakespeare-twin-")
        for row in rounds.itertuples():
            print(
                f"| {name} | {row.round} | {100 * row.mean_accuracy:.1f} | "
                f"{100 * row.worst10_accuracy:.1f} | {row.mean_loss:.2f} |"
            )
        axis.plot(rounds["round"], 100 * rounds["mean_accuracy"], marker="o", label=name)
    axis.set_xlabel("round")
    axis.set_ylabel("mean test accuracy (%)")
    axis.set_title("next character, LEAF Shakespeare format (licence-text twin)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(RESULTS / "shakespeare_twin.png", dpi=120)


if __name__ == "__main__":
    main(Path(sys.argv[1]))
