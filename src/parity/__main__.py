"""`python -m parity`: the same as the `parity` command."""

from parity.cli import main

main()
