"""What every extractor takes and returns, and the helpers they share."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol


@dataclass(frozen=True)
class EpisodeInput:
    episode_id: str
    group_id: str
    kind: str  # message | text | json
    content: str
    valid_at: datetime  # t_ref
    source_id: str = ""
    speaker: str | None = None
    title: str | None = None
    source: str | None = None
    context: tuple[str, ...] = ()


@dataclass
class ExtractedEntity:
    name: str
    label: str
    attributes: str | None = None  # JSON object


@dataclass
class ExtractedFact:
    source: str
    target: str
    relation: str
    fact: str
    valid_at: datetime | None = None
    invalid_at: datetime | None = None
    date_text: str | None = None
    undated: bool = False  # "we lived in Bristol before": held once, not at t_ref


@dataclass
class Extraction:
    entities: list[ExtractedEntity] = field(default_factory=list)
    facts: list[ExtractedFact] = field(default_factory=list)
    error: str | None = None
    raw_output: str | None = None
    llm_calls: int = 0  # LLM backends: what this episode cost
    llm_prompt_tokens: int = 0
    llm_completion_tokens: int = 0
    llm_retries: int = 0

    def add_entity(self, name: str, label: str, attributes: str | None = None) -> None:
        """Add an entity once (first label wins); facts refer to entities by name."""
        if not any(e.name == name for e in self.entities):
            self.entities.append(ExtractedEntity(name, label, attributes))


class Extractor(Protocol):
    """Turns a batch of episodes into entities and facts; backends differ only here."""

    def extract(self, episodes: list[EpisodeInput]) -> list[Extraction]: ...


def relation_name(*words: str) -> str:
    """SCREAMING_SNAKE_CASE relation from its words: ("work", "at") -> WORK_AT."""
    text = "_".join(w for w in words if w)
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text)
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").upper() or "RELATED_TO"
