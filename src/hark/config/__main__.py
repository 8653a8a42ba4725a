"""``python -m hark.config docs > docs/configuration.md``: the options' page, generated."""

import sys

from hark.config.options import main

sys.exit(main(sys.argv[1:]))
