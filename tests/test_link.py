"""Linking the people and things a question names (`tkg.query.link`), on the names of the
sample corpus and through a search on the tiny store."""

from __future__ import annotations

import numpy as np
import pytest
from tkg.query.link import build_index, words

from tests.query_store import build_store

NAMES = ["Daniel Okafor", "Maria Lopez", "Berlin", "Paris", "Maria Chen", "T-17", "AI"]
LABELS = [["Person"], ["Person"], ["Location"], ["Location"], ["Person"], ["Object"],
          ["Object"]]
SPEAKERS = ["Daniel Okafor", "Maria Lopez", "Daniel Okafor", None, "Maria Lopez"]


def index():
    return build_index(NAMES, LABELS, np.zeros(len(NAMES), np.int64), {3: ["City of Light"]},
                       SPEAKERS, np.zeros(len(SPEAKERS), np.int64))


def test_words_cut_possessives():
    assert words("What are Daniel's hobbies?") == ["what", "are", "daniel", "hobbies"]


@pytest.mark.parametrize("question, entities, spoken", [
    ("Where does Daniel Okafor live?", [0], [0, 2]),
    ("What did Daniel say about Berlin?", [0, 2], [0, 2]),  # a unique first name links
    ("Did Maria move?", [], [1, 4]),  # two persons named Maria: no entity, the speaker
    ("Is the city of light nice?", [3], []),  # an alias, case-insensitive
    ("Is AI overrated?", [], []),  # names shorter than three letters never link
    ("Where does Daniela live?", [], []),  # whole words only
])
def test_named(question, entities, spoken):
    assert index().named(question, [0]) == (entities, spoken)


def test_other_groups_do_not_link():
    assert index().named("Where does Daniel Okafor live?", [1]) == ([], [])


def test_linked_episodes_in_a_search(tmp_path):
    from dataclasses import replace

    from tkg.pipeline.config import TkgConfig
    from tkg.query.api import snapshot_embedder
    from tkg.query.recipes import Part, get_recipe

    from tkg import query

    embedder = snapshot_embedder({"config": TkgConfig().model_dump(), "embedding": {}})
    retriever = query.open(build_store(tmp_path / "store", embedder))
    only_linked = replace(get_recipe("episodes_flat_rrf"), episodes=Part(("linked",), "rrf"))
    found = retriever.search("Where does Bruno Costa work?", "g1", recipe=only_linked)
    assert [e.source_id for e in found.episodes] == ["m3"]  # the one episode naming him
    spoken = retriever.search("What did Ana say?", "g1", recipe=only_linked)
    assert {e.source_id for e in spoken.episodes} == {"m1", "m2", "m3", "m4"}  # her turns
    assert retriever.search("Where does Zed work?", "g1", recipe=only_linked).episodes == []

    # A snapshot given the id of a freed one (CPython reuses addresses) gets its own index,
    # not the one built for the snapshot that had that id.
    from tkg.query import derived, link

    snap = retriever.snapshot()
    stale = index()
    derived._DERIVED[id(snap)] = (lambda: object(), {"name index": stale})  # a freed one's
    assert link.name_index(snap) is not stale
    assert link.name_index(snap) is link.name_index(snap)  # and built once


@pytest.mark.parametrize("question, left", [
    ("What are Daniel Okafor's hobbies?", "What are hobbies?"),
    ("What did Daniel say about Berlin?", "What did say about Berlin?"),  # places stay
    ("Did Maria move?", "Did move?"),  # a speaker's first name, even when two share it
    ("Daniel Okafor", "Daniel Okafor"),  # nothing but a name: kept whole
    ("Where is Paris?", "Where is Paris?"),
])
def test_without_speakers(question, left):
    assert index().without_speakers(question, [0]) == left
    assert index().without_speakers(question, [1]) == question  # another group's speakers
