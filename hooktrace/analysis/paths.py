"""Module paths relative to each other (the call tree's and the renderers' comparisons)."""

from __future__ import annotations

from typing import Optional


def contains(outer: Optional[str], inner: Optional[str]) -> bool:
    """`inner` is the module path `outer` or one of its descendants ("" is the root)."""
    if outer is None or inner is None:
        return False
    return outer == "" or inner == outer or inner.startswith(outer + ".")


def relative(child: Optional[str], parent: Optional[str]) -> Optional[str]:
    """`child` relative to `parent`, so that `layers.0.fc` under `layers.0` equals `layers.1.fc`."""
    if child is None or parent is None:
        return child
    if child == parent:
        return ""
    if parent == "":
        return child
    if child.startswith(parent + "."):
        return child[len(parent) + 1 :]
    return child


def _parent_path(path: Optional[str]) -> Optional[str]:
    return path.rsplit(".", 1)[0] if path and "." in path else None


def _relative_tensor(tensor: Optional[str], parent: Optional[str]) -> Optional[str]:
    if tensor is None or not parent:
        return tensor
    return tensor.replace(parent + ".", "", 1)
