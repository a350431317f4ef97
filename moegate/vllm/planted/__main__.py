"""``python -m moegate.vllm.planted DEST --python PY [--site DIR]... [--bug SPEC]``: see the package docstring."""

import sys

from moegate.vllm.planted import main

sys.exit(main())
