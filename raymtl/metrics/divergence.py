"""Seeds whose training turned non-finite (a learning rate too large, an update that
overflowed): which seed, from which round, and what showed it.

summary.json lists them under "diverged" (an empty list when none did):

    {"seed": 1, "round": 3, "what": "12 non-finite updates rejected, test loss NaN",
     "updates_rejected_from": 3, "updates_rejected": 12,
     "test_loss_from": 4, "test_loss": "NaN", "clients": 6, "of": 6, "rounds": 2}

Two signs, either enough: an aggregator rejected a client's non-finite update (its training
loss turned NaN or ±inf; warnings.parquet's rows, from `updates_rejected_from`), and an
evaluated round's mean test loss (rounds.parquet's `mean_loss`, over the clients evaluated)
was NaN or ±inf (from `test_loss_from`; `clients` of `of` clients' own loss was, at that
round; `rounds` evaluated rounds in all). `round` is the first of the two. A seed whose last
evaluated loss is not a number has no accuracy in summary.json (null, left out of the means
over seeds): its model's outputs are not numbers, whatever the arg-max of them scored. A
seed whose updates were all rejected keeps its accuracy: that of the model it kept. Bits,
times and FLOPs are counted as for any seed. The results table says so under it
(`divergence_note`), table.csv in its `diverged` column (`diverged_cell`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from raymtl.metrics.statistics import evaluated_rounds, is_number

# What warnings.parquet's message says when an aggregator rejects an update (aggregate.py).
REJECTED = "non-finite"


def non_finite_rounds(seed_rounds: pd.DataFrame) -> pd.DataFrame:
    """The evaluated rounds of one seed whose mean loss is NaN or ±inf, in round order."""
    evaluated = evaluated_rounds(seed_rounds).sort_values("round")
    loss = evaluated["mean_loss"].astype(float).to_numpy()
    return evaluated[~np.isfinite(loss)]


def first_non_finite_round(seed_rounds: pd.DataFrame) -> int | None:
    """The first evaluated round of one seed whose mean loss is not a number (None: none)."""
    bad = non_finite_rounds(seed_rounds)
    return None if bad.empty else int(bad["round"].iloc[0])


def loss_word(value: float) -> str:
    """'NaN', 'inf' or '-inf': what a non-finite loss was."""
    return "NaN" if np.isnan(value) else ("inf" if value > 0 else "-inf")


def diverged_seeds(
    rounds: pd.DataFrame, clients: pd.DataFrame, warnings: pd.DataFrame
) -> list[dict]:
    """One entry per seed whose training turned non-finite (see the module), in seed order."""
    entries = []
    for seed, seed_rounds in rounds.groupby("seed"):
        bad = non_finite_rounds(seed_rounds)
        rejected = rejected_updates(warnings, int(seed))
        if bad.empty and rejected.empty:
            continue
        entry: dict = {"seed": int(seed)}
        what = []
        if not rejected.empty:
            entry["updates_rejected_from"] = int(rejected["round"].min())
            entry["updates_rejected"] = int(len(rejected))
            what.append(f"{len(rejected)} non-finite updates rejected")
        if not bad.empty:
            first = bad.iloc[0]
            round_index = int(first["round"])
            entry["test_loss_from"] = round_index
            entry["test_loss"] = loss_word(float(first["mean_loss"]))
            what.append(f"test loss {entry['test_loss']}")
            at = clients_at(clients, int(seed), round_index)
            if not at.empty:
                losses = at["loss"].astype(float).to_numpy()
                entry["clients"] = int((~np.isfinite(losses)).sum())
                entry["of"] = int(len(at))
            entry["rounds"] = int(len(bad))
        firsts = [entry.get("updates_rejected_from"), entry.get("test_loss_from")]
        entries.append(
            {
                "seed": entry.pop("seed"),
                "round": min(r for r in firsts if r is not None),
                "what": ", ".join(what),
                **entry,
            }
        )
    return entries


def clients_at(clients: pd.DataFrame, seed: int, round_index: int) -> pd.DataFrame:
    """clients.parquet's rows of one seed's round (none in a table without losses)."""
    if clients.empty or "loss" not in clients:
        return clients.iloc[0:0]
    return clients[(clients["seed"] == seed) & (clients["round"] == round_index)]


def rejected_updates(warnings: pd.DataFrame, seed: int) -> pd.DataFrame:
    """warnings.parquet's rows of `seed` that reject a non-finite update (none: empty)."""
    if warnings.empty or not {"seed", "round", "message"} <= set(warnings.columns):
        return pd.DataFrame(columns=["seed", "round", "message"])
    rejected = warnings["message"].astype(str).str.contains(REJECTED, regex=False)
    return warnings[(warnings["seed"] == seed) & rejected]


def describe(entry: dict) -> str:
    """'seed 1 from round 3 (12 non-finite updates rejected, test loss NaN from round 4 at
    6/6 clients)'."""
    parts = []
    if "updates_rejected" in entry:
        text = f"{entry['updates_rejected']} non-finite updates rejected"
        if entry.get("updates_rejected_from", entry["round"]) != entry["round"]:
            text += f" from round {entry['updates_rejected_from']}"
        parts.append(text)
    if "test_loss_from" in entry:
        text = f"test loss {entry.get('test_loss', 'NaN')}"
        if entry["test_loss_from"] != entry["round"]:
            text += f" from round {entry['test_loss_from']}"
        if "clients" in entry and "of" in entry:
            text += f" at {entry['clients']}/{entry['of']} clients"
        parts.append(text)
    detail = ", ".join(parts) or entry.get("what", "losses not numbers")
    return f"seed {entry['seed']} from round {entry['round']} ({detail})"


def accuracy_left_out(summary: dict) -> list[int]:
    """The seeds of a summary whose accuracy is null because their last loss is not a
    number (per_seed's `diverged_from`)."""
    return [
        row["seed"]
        for row in summary.get("per_seed", [])
        if row.get("diverged_from") is not None and not is_number(row.get("mean_accuracy"))
    ]


def divergence_note(summaries: list[dict]) -> str | None:
    """The results table's lines about diverged seeds, one per experiment that has any:
    'fedavg diverged: seed 0 from round 2 (5 non-finite updates rejected, test loss NaN at
    6/6 clients); no accuracy (...)'; None when no seed diverged."""
    lines = []
    for summary in summaries:
        entries = summary.get("diverged") or []
        if not entries:
            continue
        line = f"{summary['algorithm']} diverged: " + ", ".join(describe(e) for e in entries)
        left_out = accuracy_left_out(summary)
        seeds = summary.get("seeds", [])
        if left_out and len(left_out) == len(seeds):
            line += "; no accuracy (every seed's last loss is not a number)"
        elif left_out:
            word = "seed" if len(left_out) == 1 else "seeds"
            shown = ", ".join(str(seed) for seed in left_out)
            line += f"; accuracy over the other seeds ({word} {shown} left out)"
        lines.append(line)
    return "\n".join(lines) or None


def diverged_cell(summary: dict) -> str:
    """table.csv's `diverged` column: 'seed 0 from round 2; seed 1 from round 3' or ''."""
    return "; ".join(
        f"seed {entry['seed']} from round {entry['round']}"
        for entry in summary.get("diverged") or []
    )
