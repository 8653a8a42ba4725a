"""``python -m hark.bench.ab``: what ``scripts/ab`` runs."""

import sys

from hark.bench.ab.cli import main

sys.exit(main())
