"""The people and things a question names, linked to the snapshot: entity rows (by name or
alias) and the speakers of episodes, so a search can bring in what a named person said and
the episodes that mention a named thing. Matching is on whole words, case-insensitive; a
person's first name alone links too ("Melanie" -> "Melanie Smith") when it is not also the
first name of another person of the same groups.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
from tkg.pipeline import episode_kinds
from tkg.query.derived import derived

WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?")
MIN_NAME_CHARS = 3  # shorter names ("AI", "Jo") match too many words by accident
MAX_NAME_WORDS = 6


def words(text: str) -> list[str]:
    """Lower-case words of a text, possessives cut ("Melanie's" -> "melanie")."""
    return [_word(w) for w in WORD.findall(text)]


def _word(word: str) -> str:
    return word.lower().removesuffix("'s")


@dataclass
class NameIndex:
    """Per group code: lower-case name (as a word tuple) -> entity rows; speaker name ->
    episode rows."""

    entities: dict[int, dict[tuple[str, ...], list[int]]] = field(default_factory=dict)
    speakers: dict[int, dict[tuple[str, ...], np.ndarray]] = field(default_factory=dict)
    turns: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # episode has a speaker

    def named(self, text: str, groups: Iterable[int]) -> tuple[list[int], list[int]]:
        """(entity rows, episode rows spoken by a named speaker) for the names in `text`,
        in the order the question names them."""
        tokens = words(text)
        entities: list[int] = []
        spoken: list[np.ndarray] = []
        for group in groups:
            names, speakers = self.entities.get(group, {}), self.speakers.get(group, {})
            for key in spans(tokens):
                entities += names.get(key, [])
                if key in speakers:
                    spoken.append(speakers[key])
        rows = np.unique(np.concatenate(spoken)).tolist() if spoken else []
        return list(dict.fromkeys(entities)), rows

    def without_speakers(self, text: str, groups: Iterable[int]) -> str:
        """`text` with the names of the speakers it names taken out ("What activities does
        Melanie partake in?" -> "What activities does partake in?"), for matching what
        they said: their turns seldom name them, the other person's turns do ("Hey
        Melanie!"). A text that is nothing but names is kept whole."""
        names = set().union(*(self.speakers.get(g, {}) for g in groups))
        found = list(WORD.finditer(text))
        tokens = [_word(m.group()) for m in found]
        cut: list[tuple[int, int]] = []
        i = 0
        while i < len(tokens):
            n = next((n for n in range(min(MAX_NAME_WORDS, len(tokens) - i), 0, -1)
                      if tuple(tokens[i:i + n]) in names), 0)
            if n:
                cut.append((found[i].start(), found[i + n - 1].end()))
            i += n or 1
        left = text
        for start, end in reversed(cut):
            left = left[:start] + left[end:]
        return " ".join(left.split()) if WORD.search(left) else text


def spans(tokens: list[str]) -> list[tuple[str, ...]]:
    """Every run of up to MAX_NAME_WORDS consecutive words, longest first at each start."""
    return [tuple(tokens[i:i + n]) for i in range(len(tokens))
            for n in range(min(MAX_NAME_WORDS, len(tokens) - i), 0, -1)]


def name_keys(name: str, person: bool) -> list[tuple[str, ...]]:
    """The word tuples a name is known by: the whole name, and a person's first name."""
    key = tuple(words(name))
    if not key or len(" ".join(key)) < MIN_NAME_CHARS or len(key) > MAX_NAME_WORDS:
        return []
    keys = [key]
    if person and len(key) > 1 and len(key[0]) >= MIN_NAME_CHARS:
        keys.append(key[:1])
    return keys


def build_index(entity_names: list[str | None], entity_labels: list[list[str] | None],
                entity_groups: np.ndarray, aliases: dict[int, list[str]],
                speakers: list[str | None], episode_groups: np.ndarray) -> NameIndex:
    """A NameIndex from entity names, labels and aliases (by entity row) and the episodes'
    speakers. A first name shared by two persons of a group links neither."""
    index = NameIndex()
    first_names: dict[int, dict[tuple[str, ...], set[int]]] = defaultdict(lambda: defaultdict(set))
    for row, name in enumerate(entity_names):
        group = int(entity_groups[row])
        person = "Person" in (entity_labels[row] or ())
        for text in [name or "", *aliases.get(row, [])]:
            for key in name_keys(text, person):
                if len(key) == 1 and person and len(words(text)) > 1:
                    first_names[group][key].add(row)
                else:
                    index.entities.setdefault(group, {}).setdefault(key, []).append(row)
    for group, keys in first_names.items():
        for key, rows in keys.items():
            if len(rows) == 1 and key not in index.entities.get(group, {}):
                index.entities.setdefault(group, {})[key] = sorted(rows)
    by_speaker: dict[int, dict[tuple[str, ...], list[int]]] = defaultdict(lambda: defaultdict(list))
    keys_of: dict[str | None, list[tuple[str, ...]]] = {}  # (a store has few speakers)
    for row, speaker in enumerate(speakers):
        if speaker not in keys_of:
            keys_of[speaker] = name_keys(speaker or "", person=True)
        for key in keys_of[speaker]:
            by_speaker[int(episode_groups[row])][key].append(row)
    index.speakers = {g: {k: np.asarray(v, dtype=np.int64) for k, v in keys.items()}
                      for g, keys in by_speaker.items()}
    index.turns = np.fromiter((bool(s) for s in speakers), dtype=bool, count=len(speakers))
    return index


def name_index(snap: object) -> NameIndex:
    """The snapshot's NameIndex, built once per opened snapshot (`derived`)."""
    kept = derived(snap)
    index = kept.get("name index")
    if index is not None:
        return index
    entities = snap.kinds["entities"].meta  # type: ignore[attr-defined]
    episodes = snap.kinds["episodes"].meta  # type: ignore[attr-defined]
    aliases = snapshot_aliases(snap)
    index = kept["name index"] = build_index(
        entities["name"].to_pylist(), entities["labels"].to_pylist(),
        snap.group_codes["entities"], aliases,  # type: ignore[attr-defined]
        episode_kinds.speakers(episodes), snap.group_codes["episodes"])  # type: ignore[attr-defined]
    return index


ALIASES_SQL = "SELECT DISTINCT entity_id, alias FROM entity_aliases WHERE alias IS NOT NULL"


def snapshot_aliases(snap: object) -> dict[int, list[str]]:
    """Entity row -> its aliases (the catalog's entity_aliases); none without a catalog."""
    found = snap.catalog.rows(ALIASES_SQL, []) or []  # type: ignore[attr-defined]
    rows = snap.entity_rows  # type: ignore[attr-defined]
    aliases: dict[int, list[str]] = defaultdict(list)
    for item in found:
        row = rows.get(item["entity_id"])
        if row is not None:
            aliases[row].append(item["alias"])
    return aliases
