"""Naming where a traced run failed: the module path, the hook (if any) and the exception; on the
meta device (a dry run), what needed values that meta tensors do not have."""

from __future__ import annotations

import os
import re
import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import Optional

from ..kinds import EXIT, HOOK, MODULE
from ..schema import Event, Hook, Trace, is_internal_error


def _module_words(path: Optional[str]) -> str:
    if path is None:
        return "outside any module"
    return "the root module" if path == "" else f"module '{path}'"


def failing_event(trace: Trace, exception: Optional[BaseException] = None) -> Optional[Event]:
    """The event where the run failed: the first hook that raised, else the innermost module exit.

    Events whose error matches the exception that ended the run are preferred, so an exception the
    model raised and caught itself earlier does not take the blame.
    """
    errored = [e for e in trace.events if e.error and not is_internal_error(e.error)]
    if exception is not None:  # only where this exception was raised or passed through
        text = f"{type(exception).__name__}: {exception}"
        errored = [e for e in errored if e.error == text and _passed_through(trace, e, exception)]
    for e in errored:
        if e.type in (HOOK, EXIT):
            return e
    return None


def _passed_through(trace: Trace, event: Event, exception: BaseException) -> bool:
    """A hook event is the exception's only when the exception passed through that hook: one of its
    traceback's frames is the hook's function (same file, and its first line or its name). An
    exception without a traceback (made, not raised) is taken at its word."""
    if event.type != HOOK or event.hook is None or exception.__traceback__ is None:
        return True
    try:
        hook = trace.hook(event.hook)
    except KeyError:
        return True
    file, _, line = (hook.defined_at or "").rpartition(":")
    name = hook.name.rsplit(".", 1)[-1]
    tb: Optional[TracebackType] = exception.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        same_file = not file or os.path.basename(code.co_filename) == os.path.basename(file)
        if same_file and (str(code.co_firstlineno) == line or code.co_name == name):
            return True
        tb = tb.tb_next
    return False


def describe_error(trace: Trace, exception: Optional[BaseException]) -> str:
    """One line naming the module path, the hook (if any) and the exception; in a dry run on meta,
    also what needed real data (and where), and that the order up to it is shown."""
    failure = meta_failure(exception) if exception is not None and trace.meta.dry_run else None
    text = _describe_error(trace, exception, failure)
    if failure is None:
        return text
    event = failing_event(trace, exception)
    at = f" (at {failure.where})" if failure.where else ""
    if event is not None and event.type == HOOK:
        if failure.needs_data:
            where = f" at {failure.where}" if failure.where else ""
            return f"{text}; this hook needs real data, which a dry run on meta does not have ({failure.op}{where}); {SHOWN}"
        return f"{text}; this hook calls {failure.op}, which {failure.reason} on meta{at}; {SHOWN}"
    hint = next((h for place, h in _HINTS if failure.where and re.match(place, failure.where)), None)
    return f"{text}; on meta, {failure.op} {failure.reason}{at}; {hint + '; ' if hint else ''}{SHOWN}"


SHOWN = "the hook order up to it is shown"
# (where the model's own code read values: a pattern of `file:line in function`, what a dry run can
# do instead). Checked on transformers 5 (tests/test_meta_llama.py): with no attention_mask and no
# cache (training, gradient checkpointing) it looks for packed sequences in position_ids; with a
# mask, SDPA reads it to see whether the mask may be skipped; eager attention with an explicit
# all-ones mask reads neither.
_HINTS = (
    (r"transformers/masking_utils\.py:\d+ in find_packed_sequence_indices\b",
     "transformers looks for packed sequences in position_ids when no attention_mask is given (as in "
     "training, use_cache=False): on meta pass an explicit all-ones attention_mask and build the model "
     "with attn_implementation='eager'"),
    (r"transformers/masking_utils\.py:\d+ in _ignore_causal_mask_sdpa\b",
     "transformers' SDPA attention reads attention_mask to see whether it may skip it: on meta build the "
     "model with attn_implementation='eager' (keep the all-ones attention_mask)"),
    (r"transformers/masking_utils\.py",
     "transformers read the attention mask's values: on meta use attn_implementation='eager' and an "
     "explicit all-ones attention_mask"),
)  # fmt: skip


def _describe_error(trace: Trace, exception: Optional[BaseException], failure: Optional[MetaFailure]) -> str:
    exc_text = f"{type(exception).__name__}: {exception}" if exception is not None else None
    if exception is not None and failure is not None:  # PyTorch's long explanations: the first sentence
        exc_text = f"{type(exception).__name__}: {_first_sentence(str(exception))}"
    event = failing_event(trace, exception)
    if event is None:
        return f"the run raised {exc_text} outside any traced module or hook"
    error = exc_text or event.error
    if event.type == HOOK and event.hook is not None:
        try:
            hook: Optional[Hook] = trace.hook(event.hook)
        except KeyError:
            hook = None
        name = hook.name if hook else f"#{event.hook}"
        scope = f"{hook.scope} " if hook and hook.scope != MODULE else ""
        of = f" of {_module_words(event.module)}" if event.module is not None else ""
        return f"{scope}{event.kind} hook {name} raised {error} in {event.phase}{of} (event #{event.seq}, step {event.step})"
    where = f"(event #{event.seq}, step {event.step})"
    return f"{_module_words(event.module)} raised {error} in {event.phase} {where}"


# -- the meta device: what needs values ----------------------------------------------------------


@dataclass(frozen=True)
class MetaFailure:
    """Why an exception is the meta device's: `op` needed values (`needs_data`), has no meta kernel
    or its meta kernel refused (`reason` says which); `where` is the innermost line of code outside
    torch and hooktrace (the user's or a library's) that called it."""

    op: str
    needs_data: bool
    reason: str
    where: Optional[str]


NEEDS_DATA = "needs real data"
# (PyTorch's words for a meta tensor asked for values, the operation they name)
_NEEDS_DATA = (
    (re.compile(r"Tensor\.item\(\) cannot be called on meta tensors"), "Tensor.item()"),
    (re.compile(r"Cannot copy out of meta tensor"), "a copy of values out of a meta tensor"),
    (re.compile(r"can't convert meta device type tensor to numpy"), "Tensor.numpy()"),
    (re.compile(r"register_meta function for (torch\.\w+)\(\) raises unimplemented"), "{0}()"),
)
_NO_KERNEL = re.compile(r"^([\w:.]+): attempted to run this operator with Meta tensors")
_FUSED = re.compile(r"`fused=True` requires all the params to be floating point Tensors of supported devices")
_META_KERNELS = "_meta_registrations.py"


def meta_failure(exception: BaseException) -> Optional[MetaFailure]:
    """What the meta device could not do, when `exception` is its doing: an operation that needs
    values, an operator without a meta kernel, or a meta kernel's own check; else None."""
    if not isinstance(exception, (RuntimeError, NotImplementedError, TypeError)):
        return None
    message = str(exception)
    frames = traceback.extract_tb(exception.__traceback__)
    for pattern, op in _NEEDS_DATA:
        found = pattern.search(message)
        if found:
            return MetaFailure(op.format(*found.groups()), True, NEEDS_DATA, _caller(frames))
    if _FUSED.search(message) and " meta" in message:
        return MetaFailure(
            "the optimizer's fused step",
            False,
            "does not run on meta (build it with fused=False)",
            _caller(frames),
        )
    found = _NO_KERNEL.search(message)
    if found:
        return MetaFailure(
            found.group(1), False, "has no meta kernel (it cannot run on shapes alone)", _caller(frames)
        )
    kernels = [f for f in frames if os.path.basename(f.filename) == _META_KERNELS]
    if kernels:  # a check in the meta kernel itself (a dtype only CUDA takes, ...)
        op = kernels[0].name.removeprefix("meta_")
        return MetaFailure(op, False, "was refused by its meta kernel", _caller(frames))
    return None


def script_frame(exception: BaseException) -> Optional[str]:
    """Where the user's code raised `exception` (or called what raised it): `file:line in function`."""
    return _caller(traceback.extract_tb(exception.__traceback__))


def _caller(frames: traceback.StackSummary) -> Optional[str]:
    """`file:line in function: code` of the innermost frame that is neither torch nor hooktrace."""
    import torch

    from ..capture.sites import display_path

    skip = (
        os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
    )
    for f in reversed(frames):
        if f.filename.startswith(("<hooktrace", "<frozen runpy")) or os.path.abspath(f.filename).startswith(
            skip
        ):
            continue
        line = (f.line or "").strip()
        code = f" `{line if len(line) <= 60 else line[:59] + '…'}`" if line else ""
        return f"{display_path(f.filename)}:{f.lineno} in {f.name}{code}"
    return None


def _first_sentence(text: str, limit: int = 160) -> str:
    first = " ".join(text.split()).split(". ")[0].rstrip(".")
    return first if len(first) <= limit else first[: limit - 1] + "…"
