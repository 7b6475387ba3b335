"""``python -m arbiter.server.cli``: the ``arbiter`` command."""

import sys

from arbiter.server.cli import main

sys.exit(main())
