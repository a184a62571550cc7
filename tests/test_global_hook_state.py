"""The per-test restore of the global module hook state leaves none of PyTorch's leftovers behind.

`torch.compile(module)` warns when `_has_any_global_hook()` is true; PyTorch's own handles leave
that true after a `with_kwargs` global forward hook is removed (its id stays in
`_global_forward_hooks_with_kwargs`), and a global full backward hook sets
`_global_is_full_backward_hook` for good. A test that registers either must not make a later,
unrelated test see global hooks.
"""

from __future__ import annotations

import torch.nn.modules.module as nn_module

from .global_hooks import global_module_hooks_kept


def test_pytorch_leaves_a_removed_with_kwargs_global_hook_behind():
    """The oracle: PyTorch's own behaviour, which the restore must undo."""
    with global_module_hooks_kept():
        nn_module.register_module_forward_hook(lambda *a: None, with_kwargs=True).remove()
        assert not nn_module._global_forward_hooks and nn_module._has_any_global_hook()


def test_the_restore_undoes_every_global_hook_leftover():
    before = bool(nn_module._has_any_global_hook()), nn_module._global_is_full_backward_hook
    with global_module_hooks_kept():
        nn_module.register_module_forward_hook(lambda *a: None, with_kwargs=True).remove()
        nn_module.register_module_forward_hook(lambda *a: None, always_call=True)  # never removed
        nn_module.register_module_full_backward_hook(lambda *a: None).remove()
        assert nn_module._global_is_full_backward_hook is True
    assert (bool(nn_module._has_any_global_hook()), nn_module._global_is_full_backward_hook) == before
    assert (
        not nn_module._global_forward_hooks_with_kwargs and not nn_module._global_forward_hooks_always_called
    )
