"""Extractors: the CPU default (spaCy) and, later, LLM backends behind the same protocol."""

from __future__ import annotations

from collections.abc import Callable

from tkg.pipeline.config import TkgConfig
from tkg.pipeline.extract.base import EpisodeInput, Extraction, Extractor
from tkg.pipeline.extract.spacy_extractor import SpacyExtractor


def _llm(config: TkgConfig) -> Extractor:
    from tkg.pipeline.extract.llm import LlmExtractor

    return LlmExtractor(config)


BACKENDS: dict[str, Callable[[TkgConfig], Extractor]] = {"spacy": SpacyExtractor, "llm": _llm}

__all__ = ["BACKENDS", "EpisodeInput", "Extraction", "Extractor", "build_extractor"]


def build_extractor(config: TkgConfig) -> Extractor:
    """The configured backend; adding one means adding it to BACKENDS, nothing else."""
    return BACKENDS[config.extract.backend](config)
