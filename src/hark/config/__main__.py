"""``python -m hark.config docs > docs/configuration.md``: the options' page, generated."""

import sys

from hark.config.options import configuration_page
from hark.config.relay import RELAY_OPTIONS

if sys.argv[1:] != ["docs"]:
    print("usage: python -m hark.config docs > docs/configuration.md", file=sys.stderr)
    sys.exit(2)
sys.stdout.write(configuration_page(RELAY_OPTIONS))
