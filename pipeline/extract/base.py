"""What every extractor takes and returns, and the helpers they share."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from typing import Any, Protocol


@dataclass(frozen=True)
class EpisodeInput:
    episode_id: str
    group_id: str
    kind: str  # a name in pipeline/episode_kinds.py
    content: str
    valid_at: datetime  # t_ref
    source_id: str = ""
    speaker: str | None = None
    title: str | None = None
    source: str | None = None
    context: tuple[str, ...] = ()

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> EpisodeInput:
        """An episode row (EPISODE_COLUMNS; `valid_at` may be ISO text, a naive time is
        UTC) as an extractor's input."""
        valid_at = row["valid_at"]
        if isinstance(valid_at, str):
            valid_at = datetime.fromisoformat(valid_at)
        if valid_at.tzinfo is None:
            valid_at = valid_at.replace(tzinfo=UTC)
        return cls(
            episode_id=row["episode_id"], group_id=row["group_id"], kind=row["kind"],
            content=row["content"] or "", valid_at=valid_at, source_id=row.get("source_id") or "",
            speaker=row.get("speaker"), title=row.get("title"), source=row.get("source"),
            context=tuple(row.get("context") or ()),
        )


EPISODE_COLUMNS = tuple(f.name for f in fields(EpisodeInput))  # what an extractor reads


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


def guarded(extract: Callable[..., Extraction], *args: object) -> Extraction:
    """`extract(*args)`, or, when it fails, an empty extraction with the error: one odd
    episode never fails its batch."""
    try:
        return extract(*args)
    except Exception as exc:
        return Extraction(error=f"extraction failed: {type(exc).__name__}: {exc}")


def relation_name(*words: str) -> str:
    """SCREAMING_SNAKE_CASE relation from its words: ("work", "at") -> WORK_AT."""
    text = "_".join(w for w in words if w)
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", text)
    return re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").upper() or "RELATED_TO"
