"""`python -m legacy.run_tf1`: the command line (legacy/run_tf1/cli.py)."""
import sys

from legacy.run_tf1.cli import main

sys.exit(main())
