"""runtime.precision: bf16-mixed on a CPU without bfloat16 units is emulated (several times
slower than fp32): the driver says so in one warning before the run starts."""

from __future__ import annotations

import logging

from raymtl.runtime.executors.planning import check_federation
from raymtl.runtime.hosts import compute

AVX2_ONLY = "processor\t: 0\nflags\t\t: fpu sse sse2 avx fma avx2\n"
SAPPHIRE = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile\n"


def test_bf16_units_are_read_from_the_cpu_flags():
    assert compute.bf16_emulated(AVX2_ONLY)
    assert not compute.bf16_emulated(SAPPHIRE)
    assert not compute.bf16_emulated("no flags line here")  # nothing to say


def test_the_driver_warns_once_for_emulated_bf16(make_config, monkeypatch, caplog):
    monkeypatch.setattr(compute, "bf16_emulated", lambda: True)
    with caplog.at_level(logging.WARNING, logger="raymtl.runtime.executors.planning"):
        check_federation(make_config(**{"runtime.precision": "bf16-mixed"}))
        check_federation(make_config())  # fp32: nothing
    (record,) = caplog.records
    assert "bf16-mixed on a CPU without bfloat16 units" in record.getMessage()
    assert "avx512_bf16" in record.getMessage()
