"""The LLM extractor: one structured-output call per text or message episode (plus an
optional reflexion pass), returning the same Extraction as the spaCy extractor, with fact
dates resolved to UTC, so every later stage is unchanged. Kinds with a fixed mapping (JSON
records: `records.py`) keep it: it is exact and costs no call.

An answer that cannot be used is asked again once with the error; after that the episode
keeps no extraction, and its error and raw answer go to `rejects` (stage `extract`).
"""

from __future__ import annotations

from tkg.pipeline.config import TkgConfig
from tkg.pipeline.episode_kinds import mapped_extractions
from tkg.pipeline.extract.base import EpisodeInput, Extraction
from tkg.pipeline.llm import LLMS, build_llm
from tkg.pipeline.llm.calls import complete_parsed
from tkg.pipeline.llm.parse import parse_extraction
from tkg.pipeline.llm.prompting import extraction_request, reflexion_request


class LlmExtractor:
    """Extractor protocol over any LLM backend; one instance per worker."""

    def __init__(self, config: TkgConfig, llm=None) -> None:
        self.config = config
        self.llm = llm if llm is not None else build_llm(config.llm)

    def extract(self, episodes: list[EpisodeInput]) -> list[Extraction]:
        results, texts = mapped_extractions(episodes, self.config.extract.record_fact_depth,
                                            self.config.records)
        context = self.config.extract.context_messages
        requests = [extraction_request(episodes[i], context, self.config.facts,
                                       self.config.ontology) for i in texts]
        outcomes = complete_parsed(
            self.llm, requests, lambda k, text: parse_extraction(text, episodes[texts[k]]),
            kind="extract")
        for index, outcome in zip(texts, outcomes, strict=True):
            found = outcome.value or Extraction(error=outcome.error, raw_output=outcome.raw)
            found.llm_calls += outcome.calls
            found.llm_prompt_tokens += outcome.prompt_tokens
            found.llm_completion_tokens += outcome.completion_tokens
            found.llm_retries += outcome.retries
            results[index] = found
        if self.config.llm.reflexion:
            self._reflect(episodes, [i for i in texts if results[i].error is None], results)
        return [r if r is not None else Extraction() for r in results]

    def _reflect(self, episodes: list[EpisodeInput], done: list[int],
                 results: list[Extraction | None]) -> None:
        """Ask once more per extracted episode for what was missed; merge what comes back.
        A failed reflexion keeps the first answer (it is an improvement, not a requirement)."""
        context = self.config.extract.context_messages
        requests = [reflexion_request(episodes[i], results[i], context) for i in done]
        outcomes = complete_parsed(
            self.llm, requests, lambda k, text: parse_extraction(text, episodes[done[k]]),
            kind="reflexion")
        for index, outcome in zip(done, outcomes, strict=True):
            found = results[index]
            found.llm_calls += outcome.calls
            found.llm_prompt_tokens += outcome.prompt_tokens
            found.llm_completion_tokens += outcome.completion_tokens
            found.llm_retries += outcome.retries
            if outcome.value is None:
                continue
            for entity in outcome.value.entities:
                found.add_entity(entity.name, entity.label, entity.attributes)
            known = {(f.source, f.target, f.relation) for f in found.facts}
            found.facts += [f for f in outcome.value.facts
                            if (f.source, f.target, f.relation) not in known]


def dataset_extractor(config: TkgConfig):
    """The extraction that runs on a whole Ray Dataset instead of per batch (vLLM on GPU
    actors through ray.data.llm: the backend's `dataset_extract`), or None when extraction
    runs through `Extractor`."""
    if config.extract.backend != "llm" or config.llm.backend not in LLMS:
        return None
    return getattr(LLMS.factory(config.llm.backend), "dataset_extract", None)
