"""``python -m fleetloop.cli.settings_table`` prints docs/configuration.md's table of the long-running
commands' ``FLEETLOOP_*`` settings, generated from the whole command line (a test keeps the two equal).

It sits above the CLI, which imports the settings: the settings module itself stays a leaf.
"""

from __future__ import annotations

import sys

from fleetloop.cli.main import build_parser
from fleetloop.daemon.service.settings import env_table


def main() -> int:
    sys.stdout.write(env_table(build_parser(environ={})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
