"""Analysis: pure functions of a Trace (surprise rules; diff of two traces in `diff.py`)."""

from .surprises import RULES, find_surprises

__all__ = ["RULES", "find_surprises"]
