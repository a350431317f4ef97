"""``python -m moegate.power``: the command line is ``moegate.power.cli``."""

import sys

from moegate.power.cli import main

if __name__ == "__main__":
    sys.exit(main())
