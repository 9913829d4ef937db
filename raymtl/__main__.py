"""`python -m raymtl` is the `raymtl` command."""

from raymtl.cli import main

main()
