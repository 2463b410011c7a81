"""``python -m fleetloop``: the same as the ``fleetloop`` command."""

import sys

from fleetloop.cli.main import main

sys.exit(main())
