"""``python -m moegate`` is the ``moegate`` command: ``moegate.cli``."""

from moegate.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
