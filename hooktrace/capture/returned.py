"""`returned` (docs/format.md): did a hook return a value that PyTorch uses in place of what it passed?

Not when it returns None, and not when it hands back the very object it was given: one test per
kind, on that object (the shims call `SAME[kind](result, *arguments)`).
"""

from __future__ import annotations

from typing import Any

from ..kinds import K
from .shapes import NOT_GIVEN as _MISSING


def _given(args: tuple) -> list:
    return [a for a in args if a is not _MISSING]


def _same_items(result: Any, given: Any) -> bool:
    if result is given:
        return True
    return (
        isinstance(result, tuple)
        and isinstance(given, tuple)
        and len(result) == len(given)
        and all(r is g for r, g in zip(result, given))
    )


def _same_first(result: Any, *args: Any) -> bool:  # grad, node and saved-tensor hooks
    return _same_items(result, args[0])


def _same_second(result: Any, *args: Any) -> bool:  # backward hooks: grad_input / grad_output
    return _same_items(result, args[1]) if len(_given(args)) > 1 else False


def _same_last(result: Any, *args: Any) -> bool:  # forward hooks: the output
    return _same_items(result, _given(args)[-1])


def _same_pre(result: Any, *args: Any) -> bool:  # forward pre-hooks: args, or (args, kwargs)
    given = _given(args)
    if len(given) >= 3:  # with_kwargs: (module, args, kwargs) -> (args, kwargs)
        return (
            isinstance(result, tuple) and len(result) == 2 and result[0] is given[1] and result[1] is given[2]
        )
    if len(given) < 2:
        return False
    inputs = given[1]
    if not isinstance(result, tuple):  # PyTorch wraps a single value: (result,)
        return isinstance(inputs, tuple) and len(inputs) == 1 and inputs[0] is result
    return _same_items(result, inputs)


def _same_third(result: Any, *args: Any) -> bool:  # registration hooks: (module, name, value) -> value
    given = _given(args)
    return len(given) > 2 and result is given[2]


def _ignored(result: Any, *args: Any) -> bool:  # PyTorch does not use what these return
    return True


SAME = {
    K.forward_pre: _same_pre,
    K.forward: _same_last,
    K.backward_pre: _same_second,
    K.backward: _same_second,
    K.backward_legacy: _same_second,
    K.grad: _same_first,
    K.post_accumulate_grad: _ignored,
    K.state_dict_pre: _ignored,
    K.state_dict: _same_second,
    K.load_state_dict_pre: _ignored,
    K.load_state_dict_post: _ignored,
    K.module_registration: _same_third,
    K.parameter_registration: _same_third,
    K.buffer_registration: _same_third,
    K.node_pre: _same_first,  # grad_outputs -> replaced grad_outputs
    K.node: _same_first,  # PyTorch uses what a post hook returns in place of grad_inputs
    # pack's result is what autograd stores, unpack's what it restores: their purpose, not a value that
    # replaced what other hooks see (no `replaced-value` for them)
    K.pack: _ignored,
    K.unpack: _ignored,
    K.comm: _ignored,  # the future is the hook's result, not a replacement
    K.fsdp_comm: _ignored,  # FSDP uses none of these results
    K.fsdp_all_reduce: _ignored,
    K.fsdp_reduce_scatter: _ignored,  # a Work or None: waited on, never used in place of a value
    K.fsdp_all_gather: _ignored,
    K.forward_wrapper: _ignored,  # the forward's output, not a replacement
    # PyTorch drops what these return
    K.final_callback: _ignored,
    K.multi_grad: _ignored,
    K.leaf_multi_grad: _ignored,
    K.optimizer_step_pre: _same_pre,  # (args, kwargs) -> (args, kwargs)
    K.optimizer_step_post: _ignored,
    K.optimizer_state_dict_pre: _ignored,
    K.optimizer_state_dict: _same_second,
    K.optimizer_load_state_dict_pre: _same_second,
    K.optimizer_load_state_dict_post: _ignored,
}
RETURN_IGNORED = frozenset(kind for kind, same in SAME.items() if same is _ignored)
