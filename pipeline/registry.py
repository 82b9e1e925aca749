"""One registry type for every pluggable backend: extractors, embedders, LLM clients,
judges, summarizers and rerankers.

An entry is registered by name with either the factory itself or a lazy `"module:attribute"`
path, so that optional, heavy backends (vLLM, FlagEmbedding, an HTTP client) are imported only
when a config picks them. Adding a backend is its module, one `register` line next to the
registry, and its name in the config literal that selects it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class UnknownBackend(ValueError):
    """A config names a backend that no registry entry has; the message lists the known."""


class Registry(Generic[T]):
    """Named factories of one kind of backend (see the module doc)."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._entries: dict[str, Callable[..., T] | str] = {}

    def register(self, name: str, factory: Callable[..., T] | str | None = None):
        """`registry.register("x", factory)`, `registry.register("x", "pkg.mod:factory")`,
        or `@registry.register("x")` on the factory."""
        if factory is not None:
            self._entries[name] = factory
            return factory

        def decorate(fn: Callable[..., T]) -> Callable[..., T]:
            self._entries[name] = fn
            return fn

        return decorate

    def factory(self, name: str) -> Callable[..., T]:
        if name not in self._entries:
            known = ", ".join(sorted(self._entries)) or "none"
            raise UnknownBackend(f"unknown {self.kind} {name!r} (known: {known})")
        entry = self._entries[name]
        if isinstance(entry, str):  # resolved once, on first use
            module, _, attribute = entry.partition(":")
            entry = getattr(importlib.import_module(module), attribute)
            self._entries[name] = entry
        return entry

    def build(self, name: str, *args: object, **kwargs: object) -> T:
        return self.factory(name)(*args, **kwargs)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def names(self) -> list[str]:
        return sorted(self._entries)
