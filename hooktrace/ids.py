"""Hook ids in a trace: PyTorch's handle ids, deep copies' ids and synthetic ids never collide.

PyTorch's `RemovableHandle` ids count up from 0 in a process: they stay below BLOCK (10**12). Ids
hooktrace makes are whole blocks above that, told apart by the parity of their block, so that no
count of either kind can ever reach the other:

- a hook in a dict copied with its module (`copy.deepcopy` keeps the handle ids) gets
  `BLOCK * 2n + id`, n = 1, 2, ... per copied hook: even blocks, and `id % BLOCK` is the handle id
  of the hook it was copied from;
- a hook with no `RemovableHandle` (forward wrappers, saved-tensor pack/unpack, DDP comm hooks)
  gets `BLOCK * (2k + 1)`, k = 500, 501, ...: odd blocks from SYNTHETIC_BASE (10**15 + 10**12) up.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count
from typing import Optional

BLOCK = 10**12
SYNTHETIC_BASE = BLOCK * 1001


def copy_id(n: int, handle_id: int) -> int:
    """The id of the n-th copied hook (n >= 1), a copy of the hook with `handle_id`."""
    return BLOCK * 2 * n + handle_id


def synthetic_ids() -> Iterator[int]:
    """SYNTHETIC_BASE, then the next odd block, and so on (a C iterator: no Python frame runs when
    it is dropped, as a generator's close would after its session ends)."""
    return count(SYNTHETIC_BASE, 2 * BLOCK)


def copy_of(hook_id: int) -> Optional[int]:
    """The handle id a copied hook's id was made from, or None if `hook_id` is not a copy's."""
    block = hook_id // BLOCK
    return hook_id % BLOCK if block >= 2 and block % 2 == 0 else None


def family(hook_id: int) -> int:
    """0 for PyTorch's handle ids, 1 for synthetic ids, 2 for copies' ids."""
    block = hook_id // BLOCK
    return 0 if block == 0 else (1 if block % 2 else 2)
