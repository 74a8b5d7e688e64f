"""Orphan blocks of the prefix index: a stored block whose parent the index does not know (the parent was
evicted before a snapshot, or its event was lost) cannot be keyed yet, since a router key chains its
parent's. It is parked under its parent's external hash and keyed as soon as that parent is stored again::

    tree.orphans:        {parent_ext: [(ext, token_bytes, extra_keys), ...]}   waiting for the parent
    tree.orphan_parent:  {ext: parent_ext}                                     to apply BlockRemoved
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvmesh.router.routing.index_stats import ReplicaBlocks
from kvmesh.router.routing.keys import RouterKeyHasher


def park_orphans(tree: ReplicaBlocks, parent: int, hashes: Sequence, token_bytes: bytes, extra,
                 block_size: int) -> None:
    """Park a chain of blocks (``token_bytes`` packed, 4 bytes a token) under ``parent``, each block under
    the one before it; a hash already held counts as a duplicate."""
    stride = 4 * block_size
    for i, ext in enumerate(hashes):
        if ext in tree.ext_to_key or ext in tree.orphan_parent:
            tree.ext_dups[ext] = tree.ext_dups.get(ext, 0) + 1
        else:
            block = (ext, token_bytes[i * stride:(i + 1) * stride], None if extra is None else extra[i])
            tree.orphans.setdefault(parent, []).append(block)
            tree.orphan_parent[ext] = parent
        parent = ext


def adopt_orphans(tree: ReplicaBlocks, hashes: Sequence, hasher: RouterKeyHasher,
                  insert: Callable[[ReplicaBlocks, Sequence, list[int]], None]) -> None:
    """Key (and ``insert``) the orphans waiting for any of the just stored ``hashes``, their children too."""
    stack = [ext for ext in hashes if ext in tree.orphans]
    while stack:
        parent = stack.pop()
        parent_key = tree.ext_to_key.get(parent)
        for ext, data, extra in tree.orphans.pop(parent, ()):
            del tree.orphan_parent[ext]
            keys = hasher.chain(data, 1, parent_key, None if extra is None else [extra])
            insert(tree, (ext,), keys)
            stack.append(ext)


def drop_orphan(tree: ReplicaBlocks, ext: int) -> None:
    """BlockRemoved for a parked block (or one of its duplicates)."""
    if tree.ext_dups.get(ext):
        tree.ext_dups[ext] -= 1
        if not tree.ext_dups[ext]:
            del tree.ext_dups[ext]
        return
    parent = tree.orphan_parent.pop(ext)
    siblings = tree.orphans[parent]
    siblings[:] = [b for b in siblings if b[0] != ext]
    if not siblings:
        del tree.orphans[parent]
