"""summary['ifca']: the ARI of IFCA's cluster picks against the true groups."""

from __future__ import annotations

import pandas as pd
import pytest

from raymtl.metrics.tables.ifca import report_ifca


def picks(round_index: int, clusters: list[int], stage: str = "eval") -> list[dict]:
    groups = [0, 0, 1, 1]
    return [
        {
            "seed": 0,
            "round": round_index,
            "client": k,
            "cluster": c,
            "stage": stage,
            "group": groups[k],
            "task": 0,
            "loss": 0.1,
        }
        for k, c in enumerate(clusters)
    ]


def test_ari_of_the_last_round_and_over_rounds(tmp_path):
    # Round 1: one cluster for all (ARI 0); round 2: the groups exactly, labels swapped (ARI 1).
    rows = picks(1, [0, 0, 0, 0]) + picks(2, [1, 1, 0, 0]) + picks(2, [3, 3, 3, 3], "train")
    pd.DataFrame(rows).to_parquet(tmp_path / "ifca_clusters.parquet")
    summary: dict = {}
    report_ifca(tmp_path, summary)
    assert summary["ifca"]["ari_last"]["mean"] == pytest.approx(1.0)
    assert summary["ifca"]["ari_mean"]["mean"] == pytest.approx(0.5)
    assert summary["ifca"]["clusters_used"]["mean"] == 2.0  # train-stage rows are not scored
