"""`python -m hooktrace.ranks JOB`: one rank's worker, started by `hooktrace run --nproc N`."""

import os
import sys

from .worker import main

code = main()
sys.stdout.flush()
sys.stderr.flush()
# Everything is written and reported: skip the interpreter's slow teardown of torch (seconds per rank).
os._exit(code)
