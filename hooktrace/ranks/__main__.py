"""`python -m hooktrace.ranks`: one rank's worker, started by PyTorch's launcher."""

from .launch import _main

_main()
