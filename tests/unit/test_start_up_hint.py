"""`raymtl run`'s line after a slow start on a Ray of its own: it names where the seconds went
and `raymtl up`; a run that joined the service, a cluster's, an in-process one or a quick one
gets none."""

from __future__ import annotations

import pandas as pd

from raymtl.cli import SLOW_START_S, start_up_hint

LOCAL_RAY = {"runtime": {"executor": "ray", "address": None, "join_up": True}}


def startup(process_s: float, joined_up: bool = False) -> pd.DataFrame:
    """startup.parquet of a 2-seed run: the first row is the run's first start."""
    first = {"seed": 0, "ray_s": 5.04, "hosts_up_s": 6.48, "build_s": 4.12}
    return pd.DataFrame(
        [
            first | {"process_s": process_s, "joined_up": joined_up},
            {"seed": 1, "ray_s": 0.0, "hosts_up_s": 0.6, "build_s": 0.1}
            | {"process_s": process_s + 60, "joined_up": joined_up},
        ]
    )


def test_a_slow_start_on_a_ray_of_its_own_names_its_parts_and_raymtl_up():
    hint = start_up_hint(LOCAL_RAY, startup(20.15))
    assert hint == (
        "start-up: the first round began 20 s after the command (Ray 5.0 s, actors 6.5 s, "
        "build and warm-up 4.1 s); `raymtl up` keeps a Ray and warm actors for the next commands"
    )


def test_no_hint_when_there_is_nothing_to_gain_or_the_user_chose():
    assert start_up_hint(LOCAL_RAY, startup(SLOW_START_S - 0.1)) is None  # quick enough
    assert start_up_hint(LOCAL_RAY, startup(20.0, joined_up=True)) is None  # joined raymtl up
    assert start_up_hint(LOCAL_RAY, None) is None  # no startup table (an older run)
    for runtime in (
        {"executor": "inline", "address": None, "join_up": True},
        {"executor": "ray", "address": "ray://head:10001", "join_up": True},  # a cluster
        {"executor": "ray", "address": None, "join_up": False},  # never join: the user's say
    ):
        assert start_up_hint({"runtime": runtime}, startup(20.0)) is None
