"""Retrieval on the sample corpus (the session's `corpus_build`, no extra build): known
facts in the top 5, valid time before and after each change, tenancy on real data, the CLI's
JSON, and the graph's lift over the flat baseline on tests/questions/corpus.jsonl."""

from __future__ import annotations

import contextlib
import io
import json
from datetime import date, timedelta

import pytest

from tests.conftest import CORPUS


@pytest.fixture(scope="module")
def retriever(corpus_build):
    from tkg import query

    return query.open(corpus_build.snapshot.parent.parent)


def _words(relation_hint: str) -> str:
    return relation_hint.lower().replace("_", " ")


def _about(fact, subject: str, obj: str) -> bool:
    return (subject.lower() in f"{fact.source} {fact.fact}".lower()
            and obj.lower() in f"{fact.target} {fact.fact}".lower())


def _stored(corpus_db, group: str, subject: str, obj: str) -> bool:
    """Whether the build extracted a current fact linking subject and object at all."""
    return corpus_db.execute(
        "SELECT count(*) FROM facts_current f JOIN entities s ON s.entity_id = "
        "f.source_entity_id JOIN entities o ON o.entity_id = f.target_entity_id "
        "WHERE f.group_id = ? AND (s.name || ' ' || f.fact) ILIKE ? "
        "AND (o.name || ' ' || f.fact) ILIKE ?",
        [group, f"%{subject}%", f"%{obj}%"]).fetchone()[0] > 0


def test_known_facts_are_in_the_top_5(retriever, corpus_db, expected):
    checked = []
    for item in expected["stable_facts"]:
        if not _stored(corpus_db, item["group_id"], item["subject"], item["object"]):
            continue  # not extracted by the rule-based extractor: nothing to retrieve
        query = f"{item['subject']} {_words(item['relation_hint'])}"
        result = retriever.search(query, [item["group_id"]], limit=5)
        assert any(_about(f, item["subject"], item["object"]) for f in result.facts), (
            query, [f.fact for f in result.facts])
        checked.append(query)
    assert len(checked) >= 9, checked


def test_as_of_before_and_after_each_change(retriever, expected):
    changes = [c for c in expected["changes"] if c.get("assert_invalidation")]
    assert len(changes) == 5
    for change in changes:
        group, subject = change["group_id"], change["subject"]
        query = f"{subject} {_words(change['relation_hint'])}"
        ended = change["old_invalid_at"]
        before = (date.fromisoformat(ended) - timedelta(days=1)).isoformat()
        old = retriever.search(query, [group], limit=5, as_of=before)
        closed = [f for f in old.facts if _about(f, subject, change["old"])]
        assert closed, (query, before, [f.fact for f in old.facts])
        assert any((f.invalid_at or "").startswith(ended) for f in closed)
        assert not any(_about(f, subject, change["new"]) for f in old.facts)
        now = retriever.search(query, [group], limit=5)
        assert any(_about(f, subject, change["new"]) for f in now.facts), (
            query, [f.fact for f in now.facts])
        # the invalidated version is gone once the change happened
        assert not any((f.invalid_at or "9").startswith(ended) for f in now.facts)
        after = retriever.search(query, [group], limit=10, as_of=ended)
        assert all(f.invalid_at is None or f.invalid_at > ended for f in after.facts)
        assert all(f.valid_at is None or f.valid_at[:10] <= ended for f in after.facts)


def test_known_at_before_the_build_knew_nothing(retriever, corpus_build):
    created = json.loads((corpus_build.snapshot / "manifest.json").read_text())["created_at"]
    empty = retriever.search("Maria Lopez", ["acme"], known_at="2020-01-01")
    assert empty.to_dict() == {"facts": [], "entities": [], "communities": [], "episodes": [],
                               "warnings": []}
    assert retriever.search("Maria Lopez", ["acme"], known_at=created).facts


@pytest.mark.parametrize("group,other", [("acme", "household"), ("household", "acme")])
def test_nothing_from_the_other_tenant(retriever, corpus_db, expected, group, other):
    for name in expected["tenant_only_names"][other] + ["Alice"]:
        for recipe in ("combined_hybrid_rrf", "facts_hybrid_mmr"):
            result = retriever.search(f"Where does {name} live and work?", [group],
                                      recipe=recipe, limit=20).to_dict()
            ids = {"facts": {f["edge_id"] for f in result["facts"]},
                   "entities": {e["entity_id"] for e in result["entities"]},
                   "episodes": {e["episode_id"] for e in result["episodes"]}}
            key = {"facts": "edge_id", "entities": "entity_id", "episodes": "episode_id"}
            for table, found in ids.items():
                if not found:
                    continue
                groups = {g for (g,) in corpus_db.execute(
                    f"SELECT DISTINCT group_id FROM {table} WHERE {key[table]} IN "
                    f"({', '.join('?' * len(found))})", list(found)).fetchall()}
                assert groups == {group}, (name, recipe, table)
    assert "Alice Chen" not in json.dumps(retriever.search("Alice", ["household"]).to_dict())


def test_cli_search_prints_the_json_object(corpus_build):
    from tkg.jobs.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["search", "--store", str(corpus_build.snapshot.parent.parent),
                     "--group", "household", "--query", "Where does Helen Walker live?",
                     "--limit", "3", "--json"])
    assert code == 0
    result = json.loads(out.getvalue())
    assert list(result) == ["facts", "entities", "communities", "episodes"]
    assert len(result["facts"]) == 3
    assert all(isinstance(e, str) for f in result["facts"] for e in f["episodes"])
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["context", "--store", str(corpus_build.snapshot.parent.parent),
                     "--group", "household", "--query", "Where does Helen Walker live?",
                     "--max-tokens", "300"])
    assert code == 0 and "<FACTS>" in out.getvalue() and "Helen Walker" in out.getvalue()


def test_default_recipe_beats_the_flat_baseline(retriever):
    from tkg.query.eval import evaluate, load_questions
    from tkg.query.recipes import BASELINE

    questions = load_questions(CORPUS.parent / "questions" / "corpus.jsonl")
    assert len(questions) >= 25
    default = retriever.recipe().name  # query.recipe
    report = evaluate(retriever, questions, default, k=10)
    graph = report["recipes"][default]["overall"]
    flat = report["recipes"][BASELINE]["overall"]
    assert graph["questions"] == flat["questions"] == len(questions)
    assert graph["recall"] > flat["recall"], (graph, flat)
