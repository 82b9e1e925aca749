"""Extractors behind one protocol: the CPU default (spaCy) and the LLM extractor.

An extractor is a class built from the whole config with `extract(episodes)`; it registers
here by name, and `extract.backend` in pipeline/config.py lists the names a config may pick.
"""

from __future__ import annotations

from tkg.pipeline.config import TkgConfig
from tkg.pipeline.extract.base import EpisodeInput, Extraction, Extractor
from tkg.pipeline.registry import Registry

EXTRACTORS: Registry[Extractor] = Registry("extractor")
EXTRACTORS.register("spacy", "tkg.pipeline.extract.spacy_extractor:SpacyExtractor")
EXTRACTORS.register("llm", "tkg.pipeline.extract.llm:LlmExtractor")
# `tkg bench scale`: a regex, so the benchmark times every stage but the models
EXTRACTORS.register("synthetic", "tkg.pipeline.synthetic_extract:SyntheticExtractor")

__all__ = ["EXTRACTORS", "EpisodeInput", "Extraction", "Extractor", "build_extractor"]


def build_extractor(config: TkgConfig) -> Extractor:
    return EXTRACTORS.build(config.extract.backend, config)
