"""`python -m coscale ...` is the same command as `coscale ...`."""

import sys

from coscale.app.cli import main

if __name__ == "__main__":
    sys.exit(main())
