"""``python -m ci.gate``: see :mod:`ci.gate.cli`."""

import sys

from ci.gate.cli import main

sys.exit(main())
