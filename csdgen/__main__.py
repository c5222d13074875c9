"""``python -m csdgen`` = the ``csdgen`` command."""

from csdgen.cli import entry

if __name__ == "__main__":
    entry()
