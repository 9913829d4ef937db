"""`python -m raymtl` is the `raymtl` command."""

from raymtl.command import main

main()
