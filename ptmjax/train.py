"""`python -m ptmjax.train ...` is `ptmjax train ...`."""

import sys

from ptmjax.cli import main

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))
