"""Every hook kind, scope, phase and event type of the trace format (docs/format.md, version 2), in one table.

Capture, analysis and renderers read kinds from here instead of spelling them as strings: each row
says where PyTorch keeps the kind's hooks, how they are registered and called, what a returned value
means, and how it is drawn. Adding a kind is one row in `TABLE` plus its capture code. This module
imports nothing (it sits below `schema`).
"""

from __future__ import annotations

from typing import Any, Iterable, NamedTuple, Optional

# Where a hook lives (HOOK `scope`).
MODULE, GLOBAL, TENSOR, NODE, OPTIMIZER, SAVED_TENSORS, ENGINE = (
    "module",
    "global",
    "tensor",
    "node",
    "optimizer",
    "saved_tensors",
    "engine",  # autograd's engine: what one backward pass runs when it ends
)
SCOPES = (MODULE, GLOBAL, TENSOR, NODE, OPTIMIZER, SAVED_TENSORS, ENGINE)

# How the root module (path "") is shown, and named in `tensor` ("output of <root>"); `--module` takes it.
ROOT = "<root>"

# How a hook's `tensor` names a tensor that is no parameter: "<place> <module path>" ("output of fc"),
# or TENSOR alone when nothing tells where it came from.
OUTPUT_OF, INPUT_OF, TENSOR_IN = "output of", "input of", "tensor in"
TENSOR_PLACES = (OUTPUT_OF, INPUT_OF, TENSOR_IN)


def names_parameter(tensor: Optional[str]) -> bool:
    """A hook's `tensor` names a parameter ("fc.weight"), not an output, an input or another tensor."""
    return bool(tensor) and tensor != TENSOR and not tensor.startswith(tuple(p + " " for p in TENSOR_PLACES))  # type: ignore[union-attr]


# When an event happened (EVENT `phase`).
FORWARD, BACKWARD, RECOMPUTE, OPTIMIZER_PHASE, OTHER = (
    "forward",
    "backward",
    "recompute",
    "optimizer",
    "other",
)
PHASES = (FORWARD, BACKWARD, RECOMPUTE, OPTIMIZER_PHASE, OTHER)

# What an event is (EVENT `type`).
HOOK, ENTER, EXIT = "hook", "enter", "exit"
GRAPH = "graph"  # a run of a graph torch.compile made (version 3): its hooks follow it, marked with it
EVENT_TYPES = (HOOK, ENTER, EXIT, GRAPH)

# `Kind.phase` of kinds that run inside a module call: the phase of that call (`forward`, or
# `recompute` when the call started during backward), `forward` when no call is open.
ENCLOSING: Optional[str] = None


class Kind(NamedTuple):
    """One hook kind, with what each layer needs to know of it.

    name: its name in the trace. scopes: where a hook of this kind may live. phase: the phase its
    hook events get (ENCLOSING: the phase of the module call it runs in). label: a short human
    label. family: its colour group in every rendering (FAMILIES). style: its terminal colour.
    dicts: (scope, attribute) of PyTorch's hook dicts that hold it (on the module, tensor or
    optimizer; for global scope, on torch.nn.modules.module or torch.optim.optimizer). registers:
    (scope, name) of the `register_*` functions that add one, same owners. args: how many positional
    arguments PyTorch passes it (a `with_kwargs` hook gets one more), None when the capture takes
    any. returned: what PyTorch uses a value the hook returns for, and who sees it then (None: PyTorch
    does not use it). call: for hooks of a call other than a module's (state dicts, registrations),
    that call in words. flags: (scope, attribute, flag) of the dicts where PyTorch marks a hook's
    `with_kwargs` or `always_call` by its id (same owners as `dicts`)."""

    name: str
    scopes: tuple[str, ...]
    phase: Optional[str]
    label: str
    family: Optional[str] = None
    style: Optional[str] = None
    dicts: tuple[tuple[str, str], ...] = ()
    registers: tuple[tuple[str, str], ...] = ()
    args: Optional[int] = None
    returned: Optional[str] = None
    call: Optional[str] = None
    flags: tuple[tuple[str, str, str], ...] = ()


# family -> (legend words, DOT fill): one colour per family, so each colour has one legend entry
FAMILIES: dict[str, tuple[str, str]] = {
    "forward": ("forward hook or wrapper", "#c8e6c9"),
    "backward": ("module backward hook", "#c5d8f0"),
    "legacy": ("legacy backward hook", "#f6d5c1"),
    "tensor": ("tensor hook (grad, post-accumulate)", "#e6d3ee"),
    "node": ("autograd node hook", "#d0ece7"),
    "comm": ("communication hook (DDP, FSDP)", "#f8d7e3"),
    "engine": ("end-of-backward callback", "#dcedc8"),
    "optimizer": ("optimizer hook", "#ffe0b2"),
    "saved": ("saved-tensor pack/unpack", "#e0e0e0"),
}

_MG = (MODULE, GLOBAL)
WITH_KWARGS, ALWAYS_CALL = "with_kwargs", "always_call"  # the register_* arguments PyTorch keeps per hook id
_INPUTS = "the module's inputs (args/kwargs): the hooks after it and the module's forward saw"
_GRAD_INPUT = "grad_input: the hooks after it and the rest of the backward pass saw"
TABLE: dict[str, Kind] = {
    k.name: k
    for k in (
        # module and global scope: around a module call
        Kind("forward_pre", _MG, ENCLOSING, "forward pre-hook", "forward", "cyan",
             ((MODULE, "_forward_pre_hooks"), (GLOBAL, "_global_forward_pre_hooks")),
             ((MODULE, "register_forward_pre_hook"), (GLOBAL, "register_module_forward_pre_hook")), 2, _INPUTS,
             flags=((MODULE, "_forward_pre_hooks_with_kwargs", WITH_KWARGS),)),
        Kind("forward", _MG, ENCLOSING, "forward hook", "forward", "green",
             ((MODULE, "_forward_hooks"), (GLOBAL, "_global_forward_hooks")),
             ((MODULE, "register_forward_hook"), (GLOBAL, "register_module_forward_hook")), 3,
             "the module's output: the hooks after it and the code that called the module saw",
             flags=((MODULE, "_forward_hooks_with_kwargs", WITH_KWARGS), (MODULE, "_forward_hooks_always_called", ALWAYS_CALL),
                    (GLOBAL, "_global_forward_hooks_with_kwargs", WITH_KWARGS),
                    (GLOBAL, "_global_forward_hooks_always_called", ALWAYS_CALL))),
        Kind("backward_pre", _MG, BACKWARD, "full backward pre-hook", "backward", "magenta",
             ((MODULE, "_backward_pre_hooks"), (GLOBAL, "_global_backward_pre_hooks")),
             ((MODULE, "register_full_backward_pre_hook"), (GLOBAL, "register_module_full_backward_pre_hook")),
             2, "grad_output: the hooks after it and the module's backward saw"),
        # full or legacy by `_is_full_backward_hook`: both live in `_backward_hooks`
        Kind("backward", _MG, BACKWARD, "full backward hook", "backward", "blue",
             ((MODULE, "_backward_hooks"), (GLOBAL, "_global_backward_hooks")),
             ((MODULE, "register_full_backward_hook"), (GLOBAL, "register_module_full_backward_hook")), 3,
             _GRAD_INPUT),
        Kind("backward_legacy", _MG, BACKWARD, "legacy backward hook", "legacy", "red", (),
             ((MODULE, "register_backward_hook"), (GLOBAL, "register_module_backward_hook")), 3, _GRAD_INPUT),
        # module scope: state dicts
        Kind("state_dict_pre", (MODULE,), OTHER, "state_dict pre-hook", None, None,
             ((MODULE, "_state_dict_pre_hooks"),), ((MODULE, "register_state_dict_pre_hook"),), call="state_dict()"),
        Kind("state_dict", (MODULE,), OTHER, "state_dict hook", None, None, ((MODULE, "_state_dict_hooks"),),
             ((MODULE, "_register_state_dict_hook"), (MODULE, "register_state_dict_post_hook")),
             returned="the state dict: the caller of state_dict() saw", call="state_dict()"),
        Kind("load_state_dict_pre", (MODULE,), OTHER, "load_state_dict pre-hook", None, None,
             ((MODULE, "_load_state_dict_pre_hooks"),),
             ((MODULE, "_register_load_state_dict_pre_hook"), (MODULE, "register_load_state_dict_pre_hook")),
             call="load_state_dict()"),
        Kind("load_state_dict_post", (MODULE,), OTHER, "load_state_dict post-hook", None, None,
             ((MODULE, "_load_state_dict_post_hooks"),), ((MODULE, "register_load_state_dict_post_hook"),),
             call="load_state_dict()"),
        # global scope: registrations
        Kind("module_registration", (GLOBAL,), OTHER, "module registration hook", None, None,
             ((GLOBAL, "_global_module_registration_hooks"),),
             ((GLOBAL, "register_module_module_registration_hook"),),
             returned="the module being registered: the module it was registered on holds it", call="module"),
        Kind("parameter_registration", (GLOBAL,), OTHER, "parameter registration hook", None, None,
             ((GLOBAL, "_global_parameter_registration_hooks"),),
             ((GLOBAL, "register_module_parameter_registration_hook"),),
             returned="the parameter being registered: the module holds it", call="parameter"),
        Kind("buffer_registration", (GLOBAL,), OTHER, "buffer registration hook", None, None,
             ((GLOBAL, "_global_buffer_registration_hooks"),), ((GLOBAL, "register_module_buffer_registration_hook"),),
             returned="the buffer being registered: the module holds it", call="buffer"),
        # tensor scope
        Kind("grad", (TENSOR,), BACKWARD, "tensor grad hook", "tensor", "yellow", ((TENSOR, "_backward_hooks"),),
             ((TENSOR, "register_hook"),), 1,
             "the tensor's gradient: the hooks after it and the rest of the backward pass saw"),
        Kind("post_accumulate_grad", (TENSOR,), BACKWARD, "post-accumulate-grad hook", "tensor", "yellow",
             ((TENSOR, "_post_accumulate_grad_hooks"),), ((TENSOR, "register_post_accumulate_grad_hook"),), 1),
        # version 2: module scope
        Kind("forward_wrapper", (MODULE,), ENCLOSING, "forward wrapper", "forward", "bright_green"),
        Kind("comm", (MODULE,), BACKWARD, "DDP communication hook", "comm", "bright_red", args=2),  # (state, bucket)
        # version 2: FSDP's communication hooks, kept on its state, not in a dict (capture/fsdp.py); the
        # module is the FSDP module whose gradients or parameters they carry
        Kind("fsdp_comm", (MODULE,), BACKWARD, "FSDP1 communication hook", "comm", "bright_red"),
        Kind("fsdp_all_reduce", (MODULE,), BACKWARD, "FSDP2 all-reduce hook", "comm", "bright_red"),
        Kind("fsdp_reduce_scatter", (MODULE,), BACKWARD, "FSDP2 custom reduce-scatter", "comm", "bright_red"),
        # in forward (the module's pre-forward all-gather) and in backward (pre-backward, prefetch)
        Kind("fsdp_all_gather", (MODULE,), ENCLOSING, "FSDP2 custom all-gather", "comm", "bright_red"),
        # version 2: autograd graph nodes (grad_fn, AccumulateGrad)
        Kind("node_pre", (NODE,), BACKWARD, "autograd node pre-hook", "node", "bright_blue", args=1,
             returned="the node's grad_outputs: the node and the hooks after it saw"),
        Kind("node", (NODE,), BACKWARD, "autograd node hook", "node", "bright_blue", args=2,
             returned="the node's grad_inputs: the rest of the backward pass saw"),
        # version 2: optimizers (per optimizer, and the global register_optimizer_step_* ones)
        Kind("optimizer_step_pre", (OPTIMIZER, GLOBAL), OPTIMIZER_PHASE, "optimizer step pre-hook", "optimizer",
             "bright_magenta", ((OPTIMIZER, "_optimizer_step_pre_hooks"), (GLOBAL, "_global_optimizer_pre_hooks")),
             ((OPTIMIZER, "register_step_pre_hook"), (GLOBAL, "register_optimizer_step_pre_hook")), 3,
             "the (args, kwargs) of step(): the hooks after it and the step saw"),
        Kind("optimizer_step_post", (OPTIMIZER, GLOBAL), OPTIMIZER_PHASE, "optimizer step post-hook", "optimizer",
             "bright_magenta", ((OPTIMIZER, "_optimizer_step_post_hooks"), (GLOBAL, "_global_optimizer_post_hooks")),
             ((OPTIMIZER, "register_step_post_hook"), (GLOBAL, "register_optimizer_step_post_hook")), 3),
        Kind("optimizer_state_dict_pre", (OPTIMIZER,), OTHER, "optimizer state_dict pre-hook", None, None,
             ((OPTIMIZER, "_optimizer_state_dict_pre_hooks"),), ((OPTIMIZER, "register_state_dict_pre_hook"),), 1,
             call="state_dict()"),
        Kind("optimizer_state_dict", (OPTIMIZER,), OTHER, "optimizer state_dict hook", None, None,
             ((OPTIMIZER, "_optimizer_state_dict_post_hooks"),), ((OPTIMIZER, "register_state_dict_post_hook"),), 2,
             "the optimizer's state dict: the caller of state_dict() saw", call="state_dict()"),
        Kind("optimizer_load_state_dict_pre", (OPTIMIZER,), OTHER, "optimizer load_state_dict pre-hook", None,
             None, ((OPTIMIZER, "_optimizer_load_state_dict_pre_hooks"),),
             ((OPTIMIZER, "register_load_state_dict_pre_hook"),), 2,
             "the state dict to load: the hooks after it and load_state_dict() saw", call="load_state_dict()"),
        Kind("optimizer_load_state_dict_post", (OPTIMIZER,), OTHER, "optimizer load_state_dict post-hook", None,
             None, ((OPTIMIZER, "_optimizer_load_state_dict_post_hooks"),),
             ((OPTIMIZER, "register_load_state_dict_post_hook"),), 1, call="load_state_dict()"),
        # version 2: hooks PyTorch APIs keep outside any hook dict (capture/hookapis.py)
        Kind("final_callback", (ENGINE,), BACKWARD, "end-of-backward callback", "engine", "cyan"),
        Kind("multi_grad", (TENSOR,), BACKWARD, "multi-grad hook", "tensor", "yellow"),
        Kind("leaf_multi_grad", (TENSOR,), BACKWARD, "leaf_function multi-grad hook", "tensor", "yellow"),
        # version 2: saved tensors (saved_tensors_hooks, save_on_cpu, checkpointing)
        Kind("pack", (SAVED_TENSORS,), ENCLOSING, "saved-tensor pack hook", "saved", "bright_black", args=1),
        Kind("unpack", (SAVED_TENSORS,), BACKWARD, "saved-tensor unpack hook", "saved", "bright_black", args=1),
    )
}  # fmt: skip
KINDS = tuple(TABLE)


class _KindNames:
    """Every kind's name as an attribute, `K.forward_pre`: a misspelt kind fails where it is used."""

    def __init__(self, names: Iterable[str]) -> None:
        self.__dict__.update({name: name for name in names})

    def __getattr__(self, name: str) -> str:  # only for names that are not kinds
        raise AttributeError(f"no hook kind {name!r}")


K: Any = _KindNames(TABLE)


def kinds_of(scope: str) -> tuple[str, ...]:
    """The kinds a hook of this scope may have, in table order."""
    return tuple(k.name for k in TABLE.values() if scope in k.scopes)


def label(kind: Optional[str]) -> str:
    """A short human label for a kind (the kind itself when unknown)."""
    info = TABLE.get(kind) if kind is not None else None
    return info.label if info is not None else str(kind)


def dicts_of(scope: str, kinds: Iterable[str] = KINDS) -> tuple[tuple[str, str], ...]:
    """(attribute, kind) of PyTorch's hook dicts of this scope, in table order."""
    return tuple((attr, k) for k in kinds for where, attr in TABLE[k].dicts if where == scope)


def registers_of(scope: str, kinds: Iterable[str] = KINDS) -> tuple[tuple[str, str], ...]:
    """(name, kind) of the `register_*` functions of this scope, in table order."""
    return tuple((name, k) for k in kinds for where, name in TABLE[k].registers if where == scope)


def family_of(kind: Optional[str]) -> Optional[str]:
    info = TABLE.get(kind) if kind is not None else None
    return info.family if info is not None else None


# Groups that analysis and capture test membership in, from the rows.
MODULE_KINDS = tuple(k.name for k in TABLE.values() if k.scopes == _MG)  # around a module call
FORWARD_KINDS = tuple(k for k in MODULE_KINDS if TABLE[k].phase is ENCLOSING)
BACKWARD_CALL_KINDS = tuple(
    k for k in MODULE_KINDS if TABLE[k].phase == BACKWARD
)  # a module call's, in backward
CLOSING_KINDS = ("backward", "backward_legacy")  # the last PyTorch runs for one module call in backward
STATE_DICT_KINDS = tuple(k.name for k in TABLE.values() if k.scopes == (MODULE,) and k.call is not None)
REGISTRATION_KINDS = tuple(k.name for k in TABLE.values() if k.scopes == (GLOBAL,) and k.call is not None)
TENSOR_KINDS = kinds_of(TENSOR)
NODE_KINDS = kinds_of(NODE)
OPTIMIZER_KINDS = kinds_of(OPTIMIZER)
SAVED_TENSORS_KINDS = kinds_of(SAVED_TENSORS)
