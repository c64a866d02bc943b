"""``python -m app.cli``: the ``ourios`` command."""

import sys

from app.cli import main

sys.exit(main())
