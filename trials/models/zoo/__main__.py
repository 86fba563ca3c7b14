"""``python -m trials.models.zoo``: the zoo's command line (``trials.models.zoo.cli``)."""

import sys

from trials.models.zoo.cli import main

if __name__ == "__main__":
    sys.exit(main())
