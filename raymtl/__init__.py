"""raymtl: federated multi-task learning on Ray.

From Python, as from the command line:

    import raymtl
    run_dir = raymtl.run("jobs/fedavg_digits.yaml", overrides=["rounds=5"])
    results = raymtl.load_results(run_dir)
    results.rounds.tail()            # pandas frames: clients, rounds, messages, every table
    results.summary["final"]         # summary.json

Names resolve lazily: importing raymtl starts nothing and imports neither Ray nor torch.
"""

from __future__ import annotations

__all__ = ["Results", "load_results", "resume", "run"]


def __getattr__(name: str):
    if name in __all__:
        from raymtl import python_api

        return getattr(python_api, name)
    raise AttributeError(f"module 'raymtl' has no attribute {name!r}")
