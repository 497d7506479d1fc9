"""`python -m bertzoo ...`: the same command line as the `bertzoo` script, every sub-command included."""

from bertzoo.cli import main

main(prog_name="bertzoo")
