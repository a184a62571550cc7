"""Capture: the only package that touches torch internals (hook dicts, registration, `_call_impl`)."""

from .session import TraceSession

__all__ = ["TraceSession"]
