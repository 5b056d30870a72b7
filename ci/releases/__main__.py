"""``python -m ci.releases``: see :mod:`ci.releases.cli`."""

import sys

from ci.releases.cli import main

sys.exit(main())
