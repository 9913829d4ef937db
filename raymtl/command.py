"""The `raymtl` command: forked from the preloaded process of `raymtl up` when one serves
this code and environment (raymtl/runtime/warm/preload.py), else run in this process.

Only the standard library is imported before that choice: a forwarded command never pays
for torch, Ray or pandas itself.
"""

from __future__ import annotations

import sys


def main() -> None:
    from raymtl.runtime.warm.preload import forward

    code = forward(sys.argv[1:])
    if code is not None:
        sys.exit(code)
    from raymtl.cli import main as run_here

    run_here()
