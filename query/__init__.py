"""Retrieval over a published store: `tkg.query.open(store).search(...)` / `.context(...)`."""

from tkg.query.api import Retriever, SearchResult, open

__all__ = ["Retriever", "SearchResult", "open"]
