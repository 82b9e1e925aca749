"""Retrieval over a published store: `tkg.query.open(store).search(...)` / `.context(...)`.

The names below load on first use, so importing one small module of the package (a CLI
parser reading the rerankers' names) does not pay for the whole retrieval stack."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tkg.query.api import Retriever, SearchResult, add_episodes, open

__all__ = ["Retriever", "SearchResult", "add_episodes", "open"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tkg.query import api

        return getattr(api, name)
    raise AttributeError(f"module 'tkg.query' has no attribute {name!r}")
