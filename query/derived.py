"""Values computed once from an object (a snapshot, one of its tables) and kept while it
lives: `derived(owner)` is that object's dict, dropped with it."""

from __future__ import annotations

import weakref
from typing import Any

# id(owner) -> (a weak reference to it, its dict). The reference tells a later object that
# got a freed one's id (CPython reuses addresses) from the one the values were made for: by
# id alone, a server's third snapshot could be given its first one's names, rows and group
# codes. An entry leaves with its owner.
_DERIVED: dict[int, tuple[weakref.ref[Any], dict[Any, Any]]] = {}


def derived(owner: object) -> dict[Any, Any]:
    """The dict of what has been computed from `owner` (which must be weakly referable);
    empty the first time, and for an object that took a freed one's id."""
    key = id(owner)
    entry = _DERIVED.get(key)
    if entry is None or entry[0]() is not owner:
        entry = _DERIVED[key] = (weakref.ref(owner), {})
        weakref.finalize(owner, _DERIVED.pop, key, None)
    return entry[1]
