"""`python -m ptmjax.train ...` is `ptmjax train ...`."""

import sys

from ptmjax.cli import command

if __name__ == "__main__":
    sys.exit(command(["train"]))
