"""The synthetic extractor (`extract.backend: synthetic`): entities and facts by a rule as
cheap as a regex, so that `tkg bench scale` times every stage but the models (a 2-core
machine parses about 150 spaCy episodes a second; this does tens of thousands).

Records (JSON episodes) are mapped as the other backends map them
(`episode_kinds.mapped_extractions`); in text, every run of capitalized words is an entity,
and each sentence relates its first entity to every other (`MENTIONED_WITH`), the speaker
of a message to each (`TALKED_ABOUT`). Not a model of meaning: a stand-in with the shape
and the name statistics of real extractions (names recur, so resolution, facts and
communities have the work they would have)."""

from __future__ import annotations

import re

from tkg.pipeline.config import TkgConfig
from tkg.pipeline.episode_kinds import mapped_extractions
from tkg.pipeline.extract.base import EpisodeInput, ExtractedFact, Extraction, guarded

NAME = re.compile(r"\b[A-Z][a-z][\w'-]*(?:\s+[A-Z][\w'-]+)*")
SENTENCE = re.compile(r"[^.!?]+[.!?]?")
# Sentence-initial words that are not names (the rule would take them for one).
_NOT_NAMES = ("The A An I We You He She They It This That What Who Where When How Could Can "
              "Please Thanks Notes Our My Is Are Do Does")
NOT_NAMES = frozenset(_NOT_NAMES.split())


class SyntheticExtractor:
    """`Extractor` of the rule above."""

    def __init__(self, config: TkgConfig) -> None:
        self.config = config

    def extract(self, episodes: list[EpisodeInput]) -> list[Extraction]:
        results, model = mapped_extractions(episodes, self.config.extract.record_fact_depth,
                                            self.config.records)
        for index in model:
            results[index] = guarded(_from_text, episodes[index])
        return [r if r is not None else Extraction() for r in results]


def _names(sentence: str) -> list[str]:
    found = []
    for match in NAME.finditer(sentence):
        words = match.group(0).split()
        while words and words[0] in NOT_NAMES:
            words = words[1:]
        if words and " ".join(words) not in found:
            found.append(" ".join(words))
    return found


def _from_text(episode: EpisodeInput) -> Extraction:
    out = Extraction()
    if episode.speaker:
        out.add_entity(episode.speaker, "Person")
    for sentence in SENTENCE.findall(episode.content):
        names = _names(sentence)
        for name in names:
            out.add_entity(name, "Person" if len(name.split()) == 2 else "Organization")
        text = sentence.strip()
        for other in names[1:]:
            out.facts.append(ExtractedFact(names[0], other, "MENTIONED_WITH", text,
                                           valid_at=episode.valid_at))
        if episode.speaker:
            for name in names:
                if name != episode.speaker:
                    out.facts.append(ExtractedFact(episode.speaker, name, "TALKED_ABOUT",
                                                   text, valid_at=episode.valid_at))
    return out
