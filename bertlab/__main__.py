"""``python -m bertlab``: the same command line as ``bertlab`` (``torchrun -m bertlab ...``)."""

import sys

from bertlab.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
