"""Sheaf-FMTL's Table 4 layout from a `raymtl compare` directory (results/baselines.md).

    python results/scripts/table4.py runs/table4_rotated

One row per arm: accuracy mean ± std over seeds (%), MB transmitted (total bits / 8e6),
TFLOPs of the whole run and to the target, peak memory of the run's processes (MB, the sum
over its hosts, mean over seeds), rounds to the target.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def row(summary: dict) -> str:
    final = summary["final"]
    accuracy = final["mean_accuracy"]
    flops = final.get("total_flops", {}).get("mean")
    memory = summary.get("peak_memory", {}).get("total_bytes", {}).get("mean")
    target = summary.get("target") or {}
    rounds = target.get("rounds")
    to_target = "not reached" if target else "-"
    if rounds is not None:
        share = f" ({target['seeds_reached']}/{target['seeds']})" if target["reached"] < 1 else ""
        tflops = target["flops"]["mean"] / 1e12 if target.get("flops") else float("nan")
        to_target = f"{rounds['mean']:.1f} rounds, {tflops:.3f} TFLOPs{share}"
    return (
        f"| {summary['algorithm']} | {100 * accuracy['mean']:.1f} ± {100 * accuracy['std']:.1f} "
        f"| {final['total_bits']['mean'] / 8e6:,.1f} "
        f"| {flops / 1e12 if flops is not None else float('nan'):.3f} "
        f"| {memory / 1e6 if memory is not None else float('nan'):,.0f} | {to_target} |"
    )


def main(folder: str) -> None:
    folder = Path(folder)
    if (folder / "summary.json").is_file():
        summaries = json.loads((folder / "summary.json").read_text())
    else:  # a comparison still running: the arms finished so far
        summaries = [
            {**json.loads(path.read_text()), "algorithm": path.parent.name}
            for path in sorted(folder.glob("*/summary.json"))
        ]
    print("| arm | accuracy % | MB transmitted | TFLOPs | peak memory MB | to the target |")
    print("|---|---|---|---|---|---|")
    for summary in summaries:
        print(row(summary))


if __name__ == "__main__":
    main(sys.argv[1])
