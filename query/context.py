"""The context string of the Zep paper's template, within a token budget.

Sections in order of value per token: facts with their valid-time ranges ("from - to",
"present" while open), entities with summaries, community summaries, then the cited
episodes (source id, time, text). Lines are added while they fit; an episode that does not
fit whole is cut to the room left (when there is room for a useful part).
Tokens are estimated as ceil(characters / 4), the usual rule of thumb for English BPE
vocabularies; the budget is therefore approximate, on the safe side for prose.
"""

from __future__ import annotations

import math
from typing import Any

HEADER = ("FACTS, ENTITIES, COMMUNITIES and EPISODES represent relevant context to the "
          "current conversation.")
FACTS_INTRO = ("These are the most relevant facts and their valid date ranges. If the fact is "
               "about an event, the event takes place during this time.\n"
               "format: FACT (Date range: from - to)")
ENTITIES_INTRO = "These are the most relevant entities\nENTITY_NAME: entity summary"
COMMUNITIES_INTRO = "These are the most relevant communities (groups of related entities)"
EPISODES_INTRO = "These are the source episodes the facts come from\n[source id, time] text"
MIN_EPISODE_TOKENS = 16  # below this, a cut episode says too little to be worth its header


def tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


UNKNOWN_END = "unknown"


def date_range(valid_at: str | None, invalid_at: str | None) -> str:
    start = _day(valid_at) if valid_at else "unknown"
    end = "present" if not invalid_at else invalid_at if invalid_at == UNKNOWN_END else _day(
        invalid_at)
    return f"{start} - {end}"


def _day(iso: str) -> str:
    """2024-06-01 at midnight UTC, else 2024-06-01 14:03 (UTC; other zones keep theirs)."""
    if iso.endswith("T00:00:00+00:00"):
        return iso[:10]
    if iso.endswith("+00:00") and len(iso) >= 16:
        return f"{iso[:10]} {iso[11:16]}"
    return iso


def _open_end(fact: Any, facts: list[Any]) -> str | None:
    """The end a fact shows: its `invalid_at`, else "present" unless the same subject's
    same relation took a later value in these facts (an undated or unclassed fact the rules
    could not end): then the end is not known."""
    if fact.invalid_at is not None or fact.valid_at is None:
        return fact.invalid_at
    later = any(o.source == fact.source and o.relation == fact.relation and o.target !=
                fact.target and o.valid_at is not None and o.valid_at > fact.valid_at
                for o in facts)
    return UNKNOWN_END if later else None


def _sections(result: Any) -> list[tuple[str, str, list[str]]]:
    # one sentence once: two facts cut from one clause share their text, the first
    # (best ranked) keeps it; so do re-delivered episodes
    shown = {f.fact: f for f in reversed(result.facts)}
    facts = [f"  - {f.fact} (Date range: {date_range(f.valid_at, _open_end(f, result.facts))})"
             for f in result.facts if shown.get(f.fact) is f]
    entities = [f"  - {e.name}: {e.summary or ''}".rstrip(": ") for e in result.entities]
    communities = [f"  - {c.name or c.community_id}: {c.summary or ''}".rstrip(": ")
                   for c in result.communities]
    texts = {" ".join(e.content.split()): e for e in reversed(result.episodes)}
    episodes = [f"  - [{e.source_id}, {_day(e.valid_at) if e.valid_at else 'undated'}] "
                f"{' '.join(e.content.split())}" for e in result.episodes
                if texts[" ".join(e.content.split())] is e]
    # the same line twice (one fact stated in two sources) costs tokens and says nothing new
    return [("FACTS", FACTS_INTRO, list(dict.fromkeys(facts))),
            ("ENTITIES", ENTITIES_INTRO, list(dict.fromkeys(entities))),
            ("COMMUNITIES", COMMUNITIES_INTRO, list(dict.fromkeys(communities))),
            ("EPISODES", EPISODES_INTRO, episodes)]


def build_context(result: Any, max_tokens: int) -> str:
    """The context for a `SearchResult`, at most about `max_tokens` tokens."""
    if max_tokens <= 0:
        raise ValueError(f"max_tokens must be positive, got {max_tokens}")
    lines = [HEADER]
    used = tokens(HEADER)
    for tag, intro, items in _sections(result):
        opening, closing = f"{intro}\n<{tag}>", f"</{tag}>"
        frame = tokens(opening) + tokens(closing) + 2
        if not items or used + frame >= max_tokens:
            continue
        body: list[str] = []
        room = max_tokens - used - frame
        for item in items:
            cost = tokens(item) + 1
            if cost <= room:
                body.append(item)
                room -= cost
            elif tag == "EPISODES" and room >= MIN_EPISODE_TOKENS:
                body.append(item[: (room - 1) * 4 - 1] + "…")
                room = 0
        if body:
            lines += ["", opening, *body, closing]
            used = max_tokens - room
    return "\n".join(lines)
