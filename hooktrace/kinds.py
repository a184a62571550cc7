"""Every hook kind, scope, phase and event type of the trace format (SPEC §4, version 2), in one table.

Capture, analysis and renderers read kinds from here instead of spelling them as strings. Adding a
kind is one row in `TABLE`. This module imports nothing (it sits below `schema`).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

# Where a hook lives (HOOK `scope`).
MODULE, GLOBAL, TENSOR, NODE, OPTIMIZER, SAVED_TENSORS = (
    "module",
    "global",
    "tensor",
    "node",
    "optimizer",
    "saved_tensors",
)
SCOPES = (MODULE, GLOBAL, TENSOR, NODE, OPTIMIZER, SAVED_TENSORS)

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
EVENT_TYPES = (HOOK, ENTER, EXIT)

# `Kind.phase` of kinds that run inside a module call: the phase of that call (`forward`, or
# `recompute` when the call started during backward), `forward` when no call is open.
ENCLOSING: Optional[str] = None


class Kind(NamedTuple):
    """One hook kind: its name in the trace, the scopes a hook of this kind may have, the phase its
    hook events get (ENCLOSING: the phase of the module call it runs in), and a short label."""

    name: str
    scopes: tuple[str, ...]
    phase: Optional[str]
    label: str


_MG = (MODULE, GLOBAL)
TABLE: dict[str, Kind] = {
    k.name: k
    for k in (
        # module and global scope: around a module call
        Kind("forward_pre", _MG, ENCLOSING, "forward pre-hook"),
        Kind("forward", _MG, ENCLOSING, "forward hook"),
        Kind("backward_pre", _MG, BACKWARD, "full backward pre-hook"),
        Kind("backward", _MG, BACKWARD, "full backward hook"),
        Kind("backward_legacy", _MG, BACKWARD, "legacy backward hook"),
        # module scope: state dicts
        Kind("state_dict_pre", (MODULE,), OTHER, "state_dict pre-hook"),
        Kind("state_dict", (MODULE,), OTHER, "state_dict hook"),
        Kind("load_state_dict_pre", (MODULE,), OTHER, "load_state_dict pre-hook"),
        Kind("load_state_dict_post", (MODULE,), OTHER, "load_state_dict post-hook"),
        # global scope: registrations
        Kind("module_registration", (GLOBAL,), OTHER, "module registration hook"),
        Kind("parameter_registration", (GLOBAL,), OTHER, "parameter registration hook"),
        Kind("buffer_registration", (GLOBAL,), OTHER, "buffer registration hook"),
        # tensor scope
        Kind("grad", (TENSOR,), BACKWARD, "tensor grad hook"),
        Kind("post_accumulate_grad", (TENSOR,), BACKWARD, "post-accumulate-grad hook"),
        # version 2: module scope
        Kind("forward_wrapper", (MODULE,), ENCLOSING, "forward wrapper"),
        Kind("comm", (MODULE,), BACKWARD, "DDP communication hook"),
        # version 2: autograd graph nodes (grad_fn, AccumulateGrad)
        Kind("node_pre", (NODE,), BACKWARD, "autograd node pre-hook"),
        Kind("node", (NODE,), BACKWARD, "autograd node hook"),
        # version 2: optimizers (per optimizer, and the global register_optimizer_step_* ones)
        Kind("optimizer_step_pre", (OPTIMIZER, GLOBAL), OPTIMIZER_PHASE, "optimizer step pre-hook"),
        Kind("optimizer_step_post", (OPTIMIZER, GLOBAL), OPTIMIZER_PHASE, "optimizer step post-hook"),
        Kind("optimizer_state_dict_pre", (OPTIMIZER,), OTHER, "optimizer state_dict pre-hook"),
        Kind("optimizer_state_dict", (OPTIMIZER,), OTHER, "optimizer state_dict hook"),
        Kind("optimizer_load_state_dict_pre", (OPTIMIZER,), OTHER, "optimizer load_state_dict pre-hook"),
        Kind("optimizer_load_state_dict_post", (OPTIMIZER,), OTHER, "optimizer load_state_dict post-hook"),
        # version 2: saved tensors (saved_tensors_hooks, save_on_cpu, checkpointing)
        Kind("pack", (SAVED_TENSORS,), ENCLOSING, "saved-tensor pack hook"),
        Kind("unpack", (SAVED_TENSORS,), BACKWARD, "saved-tensor unpack hook"),
    )
}
KINDS = tuple(TABLE)


def kinds_of(scope: str) -> tuple[str, ...]:
    """The kinds a hook of this scope may have, in table order."""
    return tuple(k.name for k in TABLE.values() if scope in k.scopes)


def label(kind: Optional[str]) -> str:
    """A short human label for a kind (the kind itself when unknown)."""
    info = TABLE.get(kind) if kind is not None else None
    return info.label if info is not None else str(kind)


# Groups that analysis and capture test membership in.
MODULE_KINDS = ("forward_pre", "forward", "backward_pre", "backward", "backward_legacy")  # around a call
FORWARD_KINDS = ("forward_pre", "forward")
STATE_DICT_KINDS = ("state_dict_pre", "state_dict", "load_state_dict_pre", "load_state_dict_post")
REGISTRATION_KINDS = ("module_registration", "parameter_registration", "buffer_registration")
TENSOR_KINDS = kinds_of(TENSOR)
NODE_KINDS = kinds_of(NODE)
OPTIMIZER_KINDS = kinds_of(OPTIMIZER)
SAVED_TENSORS_KINDS = kinds_of(SAVED_TENSORS)
