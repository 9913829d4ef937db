"""A host lost in any call of a whole (inline) run is recorded in the round it was lost in."""

from __future__ import annotations

import pandas as pd
import pytest

from raymtl.runtime.loop.federation import Federation
from tests.unit.test_executor_faults import LosingExecutor


@pytest.mark.parametrize("method", ["hold_for_evaluation", "state_report", "evaluate", "save"])
def test_a_host_lost_in_any_call_is_recorded_in_the_round_it_was_lost_in(make_config, method):
    cfg = make_config(
        **{"rounds": 3, "runtime.clients_per_actor": 3, "runtime.min_clients_fraction": 0.5}
    )
    with Federation(cfg, make_executor=lambda: LosingExecutor(cfg.runtime, method, 2)) as fed:
        rows = [fed.run_round().row for _ in range(3)]
    (fault,) = pd.read_parquet(fed.run_dir / "faults.parquet").to_dict("records")
    assert fault["round"] == 2 and fault["during"] == method and fault["host"] == "clients-0"
    assert fault["action"] == "continued without client/0, client/1, client/2"
    # Lost before the round's row was made (all but save): that row already counts them.
    lost_in_round_2 = 0 if method == "save" else 3
    assert [row["clients_lost"] for row in rows] == [0, lost_in_round_2, 3]
    clients = pd.read_parquet(fed.run_dir / "clients.parquet")
    assert set(clients[clients["round"] == 3]["client"]) == {3, 4, 5}
    complete = (fed.run_dir / "checkpoints/seed0/round00002/COMPLETE").read_text()
    assert '"lost": ["client/0", "client/1", "client/2"]' in complete
