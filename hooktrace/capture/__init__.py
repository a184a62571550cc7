"""Capture: the only package that touches torch internals (hook dicts, registration, `_call_impl`)."""

from ..supported import UnsupportedTorch, refusal, require

require()  # an older torch gets one line, before any module below reads PyTorch's internals
try:
    from .session import TraceSession
except (AttributeError, KeyError, ImportError) as exc:  # an internal that this torch does not have
    import torch

    raise refusal(torch.__version__, f"{type(exc).__name__}: {exc} in hooktrace's capture") from exc

__all__ = ["TraceSession", "UnsupportedTorch"]
