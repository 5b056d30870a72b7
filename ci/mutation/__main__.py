"""``python -m ci.mutation``: see :mod:`ci.mutation.cli`."""

import sys

from ci.mutation.cli import main

sys.exit(main())
