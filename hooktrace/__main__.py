"""`python -m hooktrace`: the same command line as the `hooktrace` script."""

import sys

from .cli import main

sys.exit(main())
