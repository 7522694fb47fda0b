"""`python -m trainguard ...` is the same as the `trainguard` command."""

from trainguard.cli import main

main()
