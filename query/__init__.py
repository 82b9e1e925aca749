"""Retrieval over a published store: `query.open(store).search(...)` / `.context(...)`."""

from query.api import Retriever, SearchResult, open

__all__ = ["Retriever", "SearchResult", "open"]
