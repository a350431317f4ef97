"""``python -m moegate.builds.planted DEST --python PY [--site DIR]... [--bug SPEC]``: see the package docstring."""

import sys

from moegate.builds.planted import main

sys.exit(main())
