"""`python -m coscale ...` is the same command as `coscale ...`."""

from coscale.cli import main

if __name__ == "__main__":
    main()
