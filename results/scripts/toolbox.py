"""The toolbox page's tables and figures (results/toolbox.md) from the `raymtl compare`
folders of jobs/toolbox/*.yaml.

    python results/scripts/toolbox.py runs/toolbox            # tables to stdout, PNGs to results/

Each comparison folder (runs/toolbox/<name>) holds one folder per arm with rounds.parquet
(mean_accuracy, cum_bits, cum_bits_up, epsilon per seed and round), summary.json,
clients.parquet and, with DP, step_metrics.parquet (the clip bound). Two comparisons have a
second folder whose arms join the first's, named <arm>@<folder>:
server_optimizers_large_lr (η 0.3 and 1) and dp_amplification (100 clients, Poisson q 0.2).
A comparison not run yet is skipped. Figures: results/toolbox_<name>.png. Accuracy is the
last evaluated round of the first seed (these runs have one).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402
import yaml  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1]


# --- reading ---------------------------------------------------------------------------------


def arms(folder: Path) -> dict[str, dict]:
    """arm name -> {rounds: the evaluated rounds (DataFrame), summary: summary.json}, in the
    comparison file's order (comparison.yaml), finished arms only."""
    order = []
    spec = folder / "comparison.yaml"
    if spec.is_file():
        order = [e["name"] for e in yaml.safe_load(spec.read_text())["experiments"]]
    found = {p.parent.name for p in folder.glob("*/summary.json")}
    names = [n for n in order if n in found] + sorted(found - set(order))
    out = {}
    for name in names:
        rounds = pd.read_parquet(folder / name / "rounds.parquet")
        summary = json.loads((folder / name / "summary.json").read_text())
        out[name] = {"rounds": rounds, "summary": summary, "path": folder / name}
    return out


def final(arm: dict, key: str) -> float:
    value = arm["summary"]["final"].get(key, {})
    return value.get("mean", float("nan")) if isinstance(value, dict) else float("nan")


def evaluated(arm: dict) -> pd.DataFrame:
    rounds = arm["rounds"]
    return rounds[rounds["mean_accuracy"].notna()].query("seed == seed.min()")


def acc(arm: dict) -> float:
    return 100 * final(arm, "mean_accuracy")


def best_acc(arm: dict) -> float:
    return 100 * evaluated(arm)["mean_accuracy"].max()


def mb(bits: float) -> str:
    return f"{bits / 8e6:,.2f}"


def epsilon(arm: dict) -> str:
    eps = arm["summary"].get("epsilon")
    if eps is None:
        return "-"
    return "∞" if eps == float("inf") else f"{eps:.2f}"


def seconds(arm: dict) -> str:
    return f"{final(arm, 'wall_time'):.0f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def save(fig, name: str) -> None:
    path = RESULTS / f"toolbox_{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"\n![{name}]({path.name})")


def curve(ax, arm: dict, label: str, x: str = "round", **style) -> None:
    data = evaluated(arm)
    ax.plot(data[x], 100 * data["mean_accuracy"], label=label, **style)


# --- 1. server optimisers --------------------------------------------------------------------


def server_optimizers(runs: dict[str, dict]) -> None:
    rows = []
    for name, arm in runs.items():
        rows.append([name, f"{acc(arm):.1f}", f"{best_acc(arm):.1f}", seconds(arm)])
    print(table(["arm", "final accuracy %", "best evaluated %", "wall s"], rows))
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    optimisers = ["fedadam", "fedyogi", "fedadagrad"]
    colours = dict(zip(optimisers, ["tab:blue", "tab:orange", "tab:green"], strict=True))
    for opt in optimisers:
        for tau, style in (("0.001", "-o"), ("0.01", "--s")):
            points = []
            for name, arm in runs.items():
                match = re.fullmatch(rf"{opt}-lr([\d.]+)-tau{tau}(@.*)?", name)
                if match:
                    points.append((float(match.group(1)), acc(arm)))
            if points:
                points.sort()
                xs, ys = zip(*points, strict=True)
                right.plot(xs, ys, style, color=colours[opt], label=f"{opt} τ={tau}")
    for name, colour in (("fedavg", "black"), ("fedavgm", "grey")):
        if name in runs:
            right.axhline(acc(runs[name]), color=colour, ls=":", label=name)
    right.set_xscale("log")
    right.set_xlabel("server learning rate η")
    right.set_ylabel("final accuracy %")
    right.set_title("final accuracy over the grid")
    right.legend(fontsize=7)
    for name, colour in (("fedavg", "black"), ("fedavgm", "grey")):
        if name in runs:
            curve(left, runs[name], name, color=colour, ls="--" if name == "fedavgm" else "-")
    for opt in optimisers:
        candidates = {n: a for n, a in runs.items() if n.startswith(opt + "-")}
        if candidates:
            name = max(candidates, key=lambda n: acc(candidates[n]))
            curve(left, candidates[name], f"{name} (best)", color=colours[opt])
    left.set_xlabel("round")
    left.set_ylabel("mean client accuracy %")
    left.set_title("FedAvg and each optimiser's best (η, τ)")
    left.legend(fontsize=7)
    save(fig, "server_optimizers")


# --- 2. robust aggregation --------------------------------------------------------------------

RULES = ["mean", "median", "trimmed_mean", "krum"]
ATTACKS = ["sign_flip", "scale", "gaussian", "label_flip"]


def robust(runs: dict[str, dict]) -> None:
    header = ["rule", "clean"] + [f"{k} {f} %" for k in ATTACKS for f in (10, 30)]
    rows = []
    for rule in RULES:
        row = [rule]
        for key in ["clean"] + [f"{k}-{f}" for k in ATTACKS for f in (10, 30)]:
            arm = runs.get(f"{rule}-{key}")
            row.append(f"{acc(arm):.1f}" if arm else "-")
        rows.append(row)
    print(table(header, rows))
    fig, axes = plt.subplots(1, 4, figsize=(14, 3.6), sharey=True)
    for ax, kind in zip(axes, ATTACKS, strict=True):
        for rule in RULES:
            points = []
            for fraction, key in ((0, "clean"), (10, f"{kind}-10"), (30, f"{kind}-30")):
                arm = runs.get(f"{rule}-{key}")
                if arm:
                    points.append((fraction, acc(arm)))
            if points:
                xs, ys = zip(*points, strict=True)
                ax.plot(xs, ys, "-o", label=rule)
        ax.set_title(kind)
        ax.set_xlabel("malicious clients %")
        ax.set_xticks([0, 10, 30])
    axes[0].set_ylabel("final mean client accuracy %")
    axes[0].legend(fontsize=8)
    save(fig, "robust")


# --- 3. differential privacy ------------------------------------------------------------------


def dp(runs: dict[str, dict]) -> None:
    rows = []
    for name, arm in runs.items():
        privacy = arm["summary"].get("privacy") or {}
        clip = ""
        metrics = arm["path"] / "step_metrics.parquet"
        if metrics.is_file():
            steps = pd.read_parquet(metrics)
            if "clip" in steps:
                last = steps[steps["round"] == steps["round"].max()].iloc[0]
                clip = f"{last['clip']:.3f} ({int(last['clipped'])}/{int(last['updates'])})"
        rows.append(
            [
                name,
                f"{acc(arm):.1f}",
                epsilon(arm),
                privacy.get("accounting", "-"),
                privacy.get("sampling", "-"),
                clip or "-",
                seconds(arm),
            ]
        )
    print(
        table(
            [
                "arm",
                "final accuracy %",
                "ε (δ 1e-5)",
                "accounting",
                "sampling",
                "last round's C (clipped/updates)",
                "wall s",
            ],
            rows,
        )
    )
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    palette = plt.get_cmap("tab20").colors  # up to 13 lines: 20 distinct colours
    palette = palette[::2] + palette[1::2]
    colour = {name: palette[i % len(palette)] for i, name in enumerate(runs)}
    for name, arm in runs.items():
        data = evaluated(arm)
        if data["epsilon"].notna().any() and arm["summary"].get("epsilon") not in (
            None,
            float("inf"),
        ):
            style = "--" if name.startswith("adaptive") else "-"
            marker = "s" if "@" in name else "o"
            left.plot(
                data["epsilon"],
                100 * data["mean_accuracy"],
                style,
                marker=marker,
                ms=3,
                label=name,
                color=colour[name],
            )
    for name in ("no_dp", "no_dp@dp_amplification"):
        if name in runs:
            left.axhline(
                acc(runs[name]),
                color="black" if name == "no_dp" else "grey",
                ls=":",
                label=f"{name} (final)",
            )
    left.set_xscale("log")
    left.set_xlabel("ε spent so far (δ = 1e-5, RDP, poisson accounting; log)")
    left.set_ylabel("mean client accuracy %")
    left.set_title("accuracy against ε, round by round")
    left.legend(fontsize=6)
    for name, arm in runs.items():
        style = "--" if name.startswith("adaptive") else "-"
        curve(right, arm, name, ls=style, color=colour[name])
    right.set_xlabel("round")
    right.set_ylabel("mean client accuracy %")
    right.set_title("accuracy by round")
    right.legend(fontsize=6)
    save(fig, "dp")


# --- 4. compression --------------------------------------------------------------------------


def compression(runs: dict[str, dict]) -> None:
    base = runs.get("fedavg")
    rows = []
    for name, arm in runs.items():
        up = final(arm, "total_bits_up")
        ratio = f"{final(base, 'total_bits_up') / up:.1f}×" if base else "-"
        rows.append(
            [name, f"{acc(arm):.1f}", mb(up), ratio, mb(final(arm, "total_bits")), seconds(arm)]
        )
    print(
        table(["arm", "final accuracy %", "uplink MB", "uplink saving", "total MB", "wall s"], rows)
    )
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, ef in zip(axes, (False, True), strict=True):
        for name, arm in runs.items():
            if name != "fedavg" and name.endswith("-ef") != ef:
                continue
            data = evaluated(arm)
            style = (
                {"color": "black", "label": "fedavg (32-bit)"}
                if name == "fedavg"
                else {"label": name}
            )
            ax.plot(data["cum_bits_up"] / 8e6, 100 * data["mean_accuracy"], "-o", ms=3, **style)
        ax.set_xscale("log")
        ax.set_xlabel("uplink MB so far (log)")
        ax.set_title("error feedback " + ("on" if ef else "off"))
        ax.legend(fontsize=7)
    axes[0].set_ylabel("mean client accuracy %")
    save(fig, "compression")


# --- 5-7. algorithms against FedAvg -----------------------------------------------------------


def pooled(arm: dict) -> float:
    """The last evaluated round's accuracy over all test samples pooled (each client weighted
    by its test split), beside the mean over clients."""
    clients = pd.read_parquet(arm["path"] / "clients.parquet")
    last = clients[
        (clients["round"] == clients["round"].max()) & (clients["seed"] == clients["seed"].min())
    ]
    return 100 * (last["accuracy"] * last["test_samples"]).sum() / last["test_samples"].sum()


def against(runs: dict[str, dict], name: str, title: str) -> None:
    rows = [
        [
            n,
            f"{acc(a):.1f}",
            f"{pooled(a):.1f}",
            f"{best_acc(a):.1f}",
            mb(final(a, "total_bits")),
            seconds(a),
        ]
        for n, a in runs.items()
    ]
    print(
        table(
            [
                "arm",
                "final accuracy % (mean over clients)",
                "pooled test accuracy %",
                "best evaluated %",
                "total MB",
                "wall s",
            ],
            rows,
        )
    )
    fig, ax = plt.subplots(figsize=(6.5, 4))
    # colour: the arm's first part (the algorithm); dashes: its second (the variant)
    families = list(dict.fromkeys(n.split("-")[0] for n in runs))
    variants = list(dict.fromkeys(n.split("-", 1)[1] for n in runs if "-" in n))
    for arm_name, arm in runs.items():
        family, _, variant = arm_name.partition("-")
        dashes = ["-", "--", ":", "-."][variants.index(variant) % 4] if variant else "-"
        curve(ax, arm, arm_name, ls=dashes, color=f"C{families.index(family)}")
    ax.set_xlabel("round")
    ax.set_ylabel("mean client accuracy %")
    ax.set_title(title)
    ax.legend(fontsize=7)
    save(fig, name)


def main(root: str) -> None:
    root = Path(root)
    sections = {
        "server_optimizers": lambda r, f: server_optimizers(r),
        "robust": lambda r, f: robust(r),
        "dp": lambda r, f: dp(r),
        "compression": lambda r, f: compression(r),
        "fednova": lambda r, f: against(r, "fednova", "FedNova against FedAvg"),
        "fedbn": lambda r, f: against(r, "fedbn", "FedBN against FedAvg (rotated groups)"),
        "weights": lambda r, f: against(
            r, "weights", "aggregation.weights: samples (solid) vs uniform (dashed)"
        ),
    }
    extra = {"server_optimizers": "server_optimizers_large_lr", "dp": "dp_amplification"}
    for name, draw in sections.items():
        folder = root / name
        runs = arms(folder) if folder.is_dir() else {}
        more = root / extra.get(name, "-")
        if more.is_dir():  # the continuation's arms, named <arm>@<its folder>
            runs |= {f"{arm}@{more.name}": run for arm, run in arms(more).items()}
        if not runs:
            print(f"\n## {name}: not run")
            continue
        print(f"\n## {name}\n")
        draw(runs, folder)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "runs/toolbox")
