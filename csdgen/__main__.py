"""``python -m csdgen`` = the ``csdgen`` command."""

import sys

from csdgen.cli import main

if __name__ == "__main__":
    sys.exit(main())
