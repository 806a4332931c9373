"""Entry point of ``python -m bench``."""

from bench.cli import main

main()
