"""Incremental runs over tiny deliveries agree with one run over all of them: a re-delivered
episode makes no new version, a new alias merges two stored entities (their old ids still
resolve through entity_aliases), a change ends a fact stored three runs earlier, and vectors
of unchanged names and facts are carried over rather than embedded again.

Four runs into one store, and one run over everything into another; every assertion reads
the published snapshots through their catalogs.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from tkg.pipeline import schema, store
from tkg.pipeline.build import BuildResult, build
from tkg.query.catalog import Catalog
from tkg.query.catalog import entity as catalog_entity

GROUP = "inc"


def _message(id_: str, day: str, speaker: str, content: str) -> dict:
    return {"group_id": GROUP, "id": id_, "kind": "message", "timestamp": f"{day}T10:00:00Z",
            "conversation_id": f"c-{id_}", "speaker": speaker, "content": content}


BERLIN = _message("m1", "2024-01-10", "Alice Chen", "Daniel Okafor lives in Berlin.")
# Two edits apart ("sofia" / "sophia"), cosine 0.92 with MiniLM: two entities on their own.
SOFIA = _message("m2", "2024-01-11", "Sofia Moreno", "Sofia Moreno lives in Madrid.")
SOPHIA = _message("m3", "2024-01-12", "Sophia Moreno", "Thanks, see you at the office.")
ACME = _message("m4", "2024-02-10", "Alice Chen", "Alice Chen works at Acme.")
# One edit from each of them: the new name connects the two stored entities.
SOPIA = _message("m5", "2024-03-10", "Sopia Moreno", "Thanks, see you at the office.")
PARIS = _message("m6", "2024-06-01", "Alice Chen", "Daniel Okafor moved to Paris.")
RUNS = ((BERLIN, SOFIA, SOPHIA), (BERLIN, ACME), (SOPIA,), (PARIS,))


def _write(folder: Path, records: tuple[dict, ...]) -> str:
    folder.mkdir(parents=True)
    (folder / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(folder)


@pytest.fixture(scope="module")
def runs(ray_session, config, tmp_path_factory) -> tuple[list[BuildResult], BuildResult]:
    """The four runs into one store, and one run over every distinct episode. The runs over
    parts run in the driver (a few rows each), the run over everything entirely on Ray Data
    and actor pools, so the two paths are held to the same answers too."""
    from tests.paths import on_ray_data

    root = tmp_path_factory.mktemp("incremental")
    parts = [build(config, [_write(root / f"in{i}", records)], root / "store",
                   run_id=f"run-{i}") for i, records in enumerate(RUNS, start=1)]
    everything = tuple({r["id"]: r for records in RUNS for r in records}.values())
    whole = build(on_ray_data(config), [_write(root / "all", everything)], root / "whole",
                  run_id="whole")
    return parts, whole


def _rows(snapshot: Path, sql: str) -> list[tuple]:
    with store.open_catalog(snapshot) as con:
        return sorted(con.execute(sql).fetchall())


def _created(result: BuildResult) -> datetime:
    run = result.summary["run_id"]
    folder = Path(result.summary["store"]) / "work" / run
    return datetime.fromisoformat((folder / "created_at").read_text())


def test_parts_give_the_answers_of_one_run(runs):
    parts, whole = runs
    last = parts[-1].snapshot
    for sql in ("SELECT entity_id, name FROM entities",
                "SELECT alias, entity_id, merged_entity_id FROM entity_aliases",
                "SELECT edge_id, relation, fact, valid_at, invalid_at, invalidated_by, "
                "episode_ids FROM facts_current",
                "SELECT episode_id, entity_id FROM mentions",
                "SELECT episode_id FROM episodes"):
        assert _rows(last, sql) == _rows(whole.snapshot, sql), sql


def test_a_redelivered_episode_makes_no_new_version(runs):
    parts, _ = runs
    assert parts[1].summary["already_ingested"] == 1
    assert _rows(parts[1].snapshot, "SELECT count(*) FROM episodes") == [(len(RUNS[0]) + 1,)]
    versions = "SELECT edge_id, version, created_at, expired_at FROM facts"
    before = set(_rows(parts[0].snapshot, versions))
    after = _rows(parts[1].snapshot, versions)
    assert before <= set(after) and {row[1] for row in after} == {1}, after


def test_a_new_alias_merges_two_stored_entities(runs):
    parts, _ = runs
    moreno = "SELECT DISTINCT entity_id FROM entity_aliases WHERE alias LIKE 'So%a Moreno'"
    apart = _rows(parts[1].snapshot, moreno)
    assert len(apart) == 2, apart
    merged = _rows(parts[2].snapshot, "SELECT alias, entity_id, merged_entity_id FROM "
                   "entity_aliases WHERE alias LIKE 'So%a Moreno'")
    assert {row[0] for row in merged} == {"Sofia Moreno", "Sophia Moreno", "Sopia Moreno"}
    assert len({row[1] for row in merged}) == 1, merged
    # the ids the two entities had still lead to the one they became
    assert {(entity,) for entity in (row[2] for row in merged)} >= set(apart)
    old_ids = {stored for (stored,) in apart}
    assert old_ids == {schema.stable_id(GROUP, "entity", n)
                       for n in ("sofia moreno", "sophia moreno")}
    catalog = Catalog(parts[2].snapshot)
    for old_id in old_ids:
        assert catalog_entity(catalog, old_id, [GROUP])["entity_id"] == merged[0][1]
    assert catalog_entity(catalog, old_ids.pop(), ["another"]) is None


def test_a_change_ends_a_fact_stored_three_runs_earlier(runs):
    parts, _ = runs
    first, last = _created(parts[0]), _created(parts[-1])
    berlin = _rows(parts[-1].snapshot, """
        SELECT version, invalid_at, created_at, expired_at FROM entity_history('Berlin')
        WHERE relation = 'LIVES_IN' AND subject = 'Daniel Okafor'""")
    assert [row[0] for row in berlin] == [1, 2], berlin
    assert berlin[0][1] is None and berlin[0][2:] == (first, last)
    assert berlin[1][1].date().isoformat() == "2024-06-01"
    assert berlin[1][2:] == (last, None)
    # runs 2 and 3 left it alone
    for result in parts[1:3]:
        assert _rows(result.snapshot, """SELECT version FROM entity_history('Berlin')
            WHERE relation = 'LIVES_IN'""") == [(1,)]


def test_a_later_run_extends_stored_subjects_from_their_stored_edges(runs):
    """Daniel Okafor kept his names, so run 4 extends his stored edges with the night's (not
    rebuilt from every earlier mention): his stored Berlin edge meets the new Paris one and
    ends where it begins, each with its own episode, as one run over everything gives."""
    from datetime import date

    parts, whole = runs
    edges = """
        SELECT t.name, f.relation, CAST(f.valid_at AS DATE), CAST(f.invalid_at AS DATE),
               (SELECT list(e.source_id) FROM episodes e
                WHERE list_contains(f.episode_ids, e.episode_id)),
               f.invalidated_by = (SELECT edge_id FROM facts_current WHERE fact LIKE '%Paris%')
        FROM facts_current f JOIN entities s ON s.entity_id = f.source_entity_id
        JOIN entities t ON t.entity_id = f.target_entity_id WHERE s.name = 'Daniel Okafor'"""
    got = _rows(parts[-1].snapshot, edges)
    assert got == [("Berlin", "LIVES_IN", date(2024, 1, 10), date(2024, 6, 1), ["m1"], True),
                   ("Paris", "LIVES_IN", date(2024, 6, 1), None, ["m6"], None)], got
    assert got == _rows(whole.snapshot, edges)


def test_a_later_run_writes_the_versions_of_the_edges_it_touched_alone(runs):
    """A later run's `versions` writes every version of the edges it touched and no other
    edge's (`Publish.replaces`); publish keeps each other edge's stored rows as they
    were, so the table is the stored one with those edges' rows replaced."""
    from itertools import pairwise

    import pyarrow.parquet as pq

    parts, _ = runs
    columns = "edge_id, version, fact, valid_at, invalid_at, created_at, expired_at"
    for before, after in pairwise(parts):
        work = (Path(after.summary["store"]) / "work" / after.summary["run_id"] / "versions"
                / "facts_versioned")
        written = pq.read_table(work).select(columns.split(", ")).to_pylist()
        touched = {row["edge_id"] for row in written}
        stored = _rows(before.snapshot, f"SELECT {columns} FROM facts")
        now = _rows(after.snapshot, f"SELECT {columns} FROM facts")
        assert touched and len(written) < len(now), (len(written), len(now))
        assert now == sorted([row for row in stored if row[0] not in touched]
                             + [tuple(row.values()) for row in written])


def test_a_later_run_names_and_resolves_again_only_what_it_touched(runs):
    """Run 4 maps only its own extractions to mentions (the earlier runs' are kept,
    `_entity_mentions`), computes again only the name nodes of the names it mentions
    (`_name_nodes`) and the rows of the entities it mentions or whose alias rows changed
    (`_resolved_entities`); its nodes, entities and mentions are those of one run over
    everything (`test_parts_give_the_answers_of_one_run`)."""
    parts, _ = runs
    work = Path(parts[-1].summary["store"]) / "work" / "run-4"
    names, resolved = (json.loads((work / stage / "_SUCCESS.json").read_text())
                       for stage in ("names", "resolve"))
    nodes = names["rows"]["name_nodes"]
    assert 0 < names["counters"]["name_nodes_computed"] < nodes, names
    # most of run 4's names were stored: their nodes merged, not grouped again
    assert 0 < names["counters"]["name_nodes_merged"] <= names["counters"][
        "name_nodes_computed"], names
    stored = store.read_manifest(parts[-1].snapshot)["tables"]["_entity_mentions"]
    assert 0 < names["rows"]["entity_mentions"] < stored, (names, stored)
    # its entities' rows merged with the night's mentions, or made again where their
    # alias rows changed
    again, merged = (resolved["counters"][name] for name in (
        "entities_resolved_again", "entities_merged"))
    assert merged > 0 and 0 < again + merged < parts[-1].summary["entities"], (
        again, merged, parts[-1].summary["entities"])


def test_unchanged_texts_keep_their_vectors(runs):
    parts, whole = runs
    marker = Path(parts[-1].summary["store"]) / "work" / "run-4" / "embed" / "_SUCCESS.json"
    counters = json.loads(marker.read_text())["counters"]
    assert counters.get("facts_vectors_carried", 0) > 0, counters
    assert counters.get("entities_vectors_carried", 0) > 0, counters
    for sql in ("SELECT entity_id, name_embedding FROM entities",
                "SELECT edge_id, fact_embedding FROM facts_current"):
        got, want = dict(_rows(parts[-1].snapshot, sql)), dict(_rows(whole.snapshot, sql))
        assert got.keys() == want.keys()
        for key, vector in got.items():  # a text's vector varies with its batch's padding
            np.testing.assert_allclose(vector, want[key], atol=1e-3)


def test_a_later_run_on_ray_data_gathers_only_what_the_night_touched(
        runs, config, tmp_path, monkeypatch):
    """Run 4 again over a copy of the store as run 3 left it, with every step on Ray Data
    and actor pools (`ray.driver_mb`, `ray.driver_rows` 0): the same published tables as
    run 4 in the driver. The facts stage brings no edge into the driver and no more names
    or entities than the night mentions, fewer than the store's aliases: the alias maps and
    stored edges stay datasets."""
    import shutil
    import sys

    from tkg.pipeline import engine

    from tests.paths import differences, on_ray_data

    parts, _ = runs
    store_dir = tmp_path / "store"
    shutil.copytree(parts[-1].summary["store"], store_dir)
    (store_dir / "CURRENT").write_text("run-3")
    for run_4 in (store_dir / "work" / "run-4", store_dir / "snapshots" / "run-4"):
        shutil.rmtree(run_4)  # run 4 again under its own id: its rows carry it
    gathered: list[pa.Table] = []
    gather = engine.gather

    def recorded(*args, **kwargs) -> pa.Table:
        table = gather(*args, **kwargs)
        if sys._getframe(1).f_globals["__name__"] == "tkg.pipeline.stages.facts":
            gathered.append(table)
        return table

    monkeypatch.setattr(engine, "gather", recorded)
    again = build(on_ray_data(config), [_write(tmp_path / "in", RUNS[-1])], store_dir,
                  run_id="run-4")
    assert differences(parts[-1].snapshot, again.snapshot) == {}
    for sql in ("SELECT entity_id, name, summary FROM entities",
                "SELECT alias, entity_id, merged_entity_id FROM entity_aliases",
                "SELECT edge_id, version, relation, fact, valid_at, invalid_at, "
                "invalidated_by, episode_ids, expired_at IS NULL FROM facts"):
        assert _rows(again.snapshot, sql) == _rows(parts[-1].snapshot, sql), sql
    (mentioned,), = _rows(parts[-1].snapshot, """SELECT count(DISTINCT m.entity_id)
        FROM mentions m JOIN episodes e USING (episode_id) WHERE e.source_id = 'm6'""")
    (aliases,), = _rows(parts[2].snapshot, "SELECT count(*) FROM entity_aliases")
    assert gathered and mentioned < aliases, (mentioned, aliases)
    for table in gathered:
        assert "edge_id" not in table.column_names and table.num_rows <= mentioned, table


def test_changed_entities_are_those_whose_names_differ():
    import pyarrow as pa
    from tkg.pipeline.resolve import changed_entities

    def names(rows: list[tuple[str, str]]) -> pa.Table:
        return pa.table({"group_id": ["g"] * len(rows), "normalized": [n for n, _ in rows],
                         "entity_id": [e for _, e in rows]})

    stored = names([("ann", "A"), ("bob", "B"), ("cy", "C"), ("dee", "D")])
    now = names([("ann", "A"), ("bob", "A"), ("cy", "C"), ("dee", "E"), ("eve", "F")])
    # A gained bob, B is gone (merged), D was renamed E, F is new; C is as it was
    assert changed_entities(stored, now) == {"A", "B", "D", "E", "F"}


def test_stored_pairs_serve_only_the_same_resolve_settings(ray_session, config, tmp_path):
    """A run under other resolve settings decides every block again: Sofia and Sopia Moreno
    (one edit apart: a spelling variant at the default similarity, not at 0.95), one entity
    after a default run, are two after a run under 0.95, as one run over everything under
    0.95 has them; the next run under those settings keeps what that one decided."""
    def recomputed_blocks(run_id: str) -> int | None:
        marker = tmp_path / "store" / "work" / run_id / "resolve" / "_SUCCESS.json"
        return json.loads(marker.read_text())["counters"].get("resolve_blocks_recomputed")

    def morenos(result: BuildResult) -> list[tuple]:
        return _rows(result.snapshot, "SELECT alias, entity_id FROM entity_aliases "
                     "WHERE alias LIKE 'So%a Moreno'")

    stricter = config.model_copy(update={
        "resolve": config.resolve.model_copy(update={"min_similarity": 0.95})})
    a, b, c = (build(settings, [_write(tmp_path / run_id, records)], tmp_path / "store",
                     run_id=run_id)
               for run_id, settings, records in (("a", config, (SOFIA, SOPIA)),
                                                 ("b", stricter, (ACME,)),
                                                 ("c", stricter, (PARIS,))))
    at_once = build(stricter, [_write(tmp_path / "all", (SOFIA, SOPIA, ACME, PARIS))],
                    tmp_path / "at_once", run_id="all")
    assert len({entity for _, entity in morenos(a)}) == 1, morenos(a)
    assert len({entity for _, entity in morenos(at_once)}) == 2, morenos(at_once)
    assert morenos(b) == morenos(c) == morenos(at_once)
    assert recomputed_blocks("b") is None
    assert recomputed_blocks("c") is not None


def test_the_nights_reads_of_stored_extractions_keep_every_fact_and_record():
    """What a night maps over every stored extraction, column by column: `fact_mentions`
    (an episode's time where a fact has none, unless it ended or is undated; a key name
    where the text calls the target by one; no row without both names; an older
    extraction without the newer fields), the pass before `record_statements`, which
    keeps every extraction whose statements it would give, and the one before a rebuilt
    subject's mentions (`_with_subjects`)."""
    from tkg.pipeline.extract import records
    from tkg.pipeline.facts import fact_mentions
    from tkg.pipeline.stages.facts import _maybe_records, _with_subjects

    day, end = datetime.fromisoformat("2024-01-01T00:00:00+00:00"), datetime.fromisoformat(
        "2024-05-01T00:00:00+00:00")

    def fact(**given: object) -> dict:
        return {"source": "The Acme", "target": "Berlin", "relation": "based_in",
                "fact": "x", "valid_at": None, "invalid_at": None, "date_text": None,
                "undated": None, "target_by_key": None, **given}

    rows = [{"episode_id": "e1", "group_id": GROUP, "valid_at": day, "facts": [
        fact(), fact(undated=True), fact(invalid_at=end), fact(valid_at=end),
        fact(target="Employee 2", target_by_key=True), fact(source=None), fact(target="!")]},
        {"episode_id": "e2", "group_id": GROUP, "valid_at": day, "facts": None}]
    mentions = fact_mentions(pa.Table.from_pylist(rows, schema=schema.EXTRACTIONS))
    assert mentions.schema == schema.FACT_MENTIONS
    assert [(m["source_normalized"], m["target_normalized"], m["valid_at"], m["invalid_at"],
             m["target_key"]) for m in mentions.to_pylist()] == [
        ("acme", "berlin", day, None, None), ("acme", "berlin", None, None, None),
        ("acme", "berlin", None, end, None), ("acme", "berlin", end, None, None),
        ("acme", "employee 2", day, None, "Employee 2")]
    older = pa.table({"group_id": [GROUP], "episode_id": ["e3"], "valid_at": pa.array(
        [day], schema.TS), "facts": pa.array([[{"source": "A", "target": "B", "relation": "r",
                                               "fact": "A r B", "valid_at": None,
                                               "invalid_at": None}]])})
    assert fact_mentions(older)["valid_at"].to_pylist() == [day]
    # the pass before a rebuilt subject's mentions: the extractions with a fact of one
    both = pa.Table.from_pylist([*rows, {"episode_id": "e4", "group_id": "other",
                                         "valid_at": day, "facts": [fact()]}],
                                schema=schema.EXTRACTIONS)
    acme = pa.array([f"{GROUP}\x1facme"], pa.string())
    assert _with_subjects(both, acme)["episode_id"].to_pylist() == ["e1"]
    assert _with_subjects(older, pa.array(["g\x1fa"]))["episode_id"].to_pylist() == []
    assert _with_subjects(older.drop_columns(["facts"]), acme).num_rows == 1

    def entity(attributes: str | None) -> dict:
        return {"name": "n", "label": "l", "attributes": attributes}

    keyed = json.dumps({schema.RECORD_ATTRIBUTE: "Employee 2"})
    extractions = pa.Table.from_pylist([
        {"episode_id": f"e{n}", "group_id": GROUP, "valid_at": day, "entities": entities,
         "facts": [fact(source="Employee 2", target="Sales", relation="department")]}
        for n, entities in enumerate([
            [entity(keyed)], [entity(None)], [], None, [entity(None), entity(keyed)],
            [entity(json.dumps({schema.RECORD_ATTRIBUTE: ""}))]])], schema=schema.EXTRACTIONS)
    kept = _maybe_records(extractions)
    assert kept["episode_id"].to_pylist() == ["e0", "e5"]
    assert records.record_statements(kept, False).equals(
        records.record_statements(extractions, False))
    assert records.record_statements(kept, False).num_rows == 2


def _answer(retriever, question: str, recipe: str) -> dict | str:
    """A search's JSON object, or its error (a recipe that needs a center entity)."""
    from tkg.query.snapshot import QueryError

    try:
        return retriever.search(question, GROUP, recipe=recipe).to_dict()
    except QueryError as error:
        return str(error)


QUESTIONS = ("Where does Daniel Okafor live?", "Who works at Acme?", "Sofia Moreno Madrid",
             "office", "Paris")


def test_extended_retrieval_tables_answer_as_tables_built_whole(runs, tmp_path):
    """Each later run extends the retrieval tables it builds on (a new LanceDB version of
    them, `tkg.pipeline.index`) rather than building them whole; searched in memory or in
    LanceDB, the last snapshot answers what the same snapshot with its tables built whole
    answers, and an earlier snapshot still reads the version it was published with."""
    import shutil

    from tkg.pipeline import index
    from tkg.pipeline.config import QueryConfig
    from tkg.query import open as open_store
    from tkg.query.recipes import RECIPES
    from tkg.query.snapshot import open_snapshot

    parts, _ = runs
    extended = [name for part in parts[1:] for name, figures in
                store.read_manifest(part.snapshot)["retrieval"].items()
                if isinstance(figures, dict) and figures["extended"]]
    assert "episodes" in extended and "facts" in extended, extended
    first = store.read_manifest(parts[0].snapshot)
    assert first["lance"]["episodes"] == "lance"
    later = store.read_manifest(parts[-1].snapshot)
    assert later["lance"]["episodes"].startswith("../run-")  # the table it extended
    assert later["retrieval"]["episodes"]["version"] > first["retrieval"]["episodes"]["version"]

    whole = tmp_path / "store"
    shutil.copytree(parts[-1].summary["store"], whole)
    snapshot = store.current_snapshot(whole)
    manifest = store.read_manifest(snapshot)
    rebuilt = index.build_indexes(snapshot, int(manifest["embedding"]["dim"]), QueryConfig(),
                                  files=store.snapshot_files(snapshot, manifest))
    store.write_manifest(snapshot, {**manifest, "retrieval": rebuilt,
                                    "lance": {n: "lance" for n in index.SPECS},
                                    "arrays": {n: "lance" for n in index.SPECS}})
    assert not any(rebuilt[n]["extended"] for n in index.SPECS)
    in_lance = QueryConfig(memory_vector_rows=0, memory_text_rows=0, exact_scan_rows=0)
    for config in (None, in_lance):
        answers = open_store(parts[-1].summary["store"], config=config)
        expected = open_store(whole, config=config)
        for question in QUESTIONS:
            for recipe in RECIPES:
                assert _answer(answers, question, recipe) == _answer(
                    expected, question, recipe), (question, recipe, config)
    first_rows = open_snapshot(parts[0].snapshot).kinds["episodes"].meta["episode_id"]
    assert sorted(first_rows.to_pylist()) == [
        row[0] for row in _rows(parts[0].snapshot, "SELECT episode_id FROM episodes")]
    assert len(first_rows) == len(RUNS[0])


def test_clean_up_keeps_the_tables_a_kept_snapshot_extends(runs, tmp_path):
    """`tkg gc --keep 0` removes every snapshot but CURRENT; the LanceDB tables CURRENT
    reads lie in the folder of the snapshot that first built them, and stay."""
    import shutil

    from tkg.pipeline import reliability
    from tkg.query import open as open_store

    parts, _ = runs
    copy = tmp_path / "store"
    shutil.copytree(parts[-1].summary["store"], copy)
    before = open_store(copy).search("Where does Daniel Okafor live?", GROUP).to_dict()
    report = reliability.gc(copy, keep=0)
    assert report.removed_snapshots and report.kept == ["run-4"]
    after = open_store(copy).search("Where does Daniel Okafor live?", GROUP).to_dict()
    assert after == before and after["facts"]
