"""``python -m ci.gate.coverage``: see :mod:`ci.gate.coverage.record`."""

import sys

from ci.gate.coverage.record import main

sys.exit(main())
