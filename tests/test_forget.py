"""Forget is a run that removes: build(all) then forget(X) publishes what build(all - X)
publishes, table by table and row by row (ids included; run ids and transaction times
aside), for selections of every kind: one episode, a whole conversation, a source, an entity
with its episodes, a group, a date cut, the episode that ended a fact, the only mention of
an entity, one alias of a merged entity, a record version in the middle of its history,
and random subsets. Each store is built once; each forget runs on a copy of it.
"""

from __future__ import annotations

import json
import random
import shutil
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from tkg.pipeline import forget as fg
from tkg.pipeline import schema, store
from tkg.pipeline.build import build
from tkg.pipeline.stages import INTERNAL_EXTRACTIONS, INTERNAL_PAIRS
from tkg.pipeline.stages.common import INTERNAL_ENTITIES, INTERNAL_NAMES
from tkg.pipeline.stages.names import INTERNAL_MENTIONS, INTERNAL_NODES

from tests.conftest import CORPUS

# Transaction times and run ids differ between any two runs; vectors are compared apart.
IGNORED = {"run_id", "created_at", "expired_at", "content_embedding", "name_embedding",
           "fact_embedding", "file", "line", "payload"}
VECTORS = {"entities": ("entity_id", "name_embedding"), "facts": ("edge_id", "fact_embedding")}
INTERNAL = {INTERNAL_EXTRACTIONS: schema.EXTRACTIONS, INTERNAL_PAIRS: schema.RESOLUTION_PAIRS,
            INTERNAL_NAMES: schema.NAME_MAP, INTERNAL_MENTIONS: schema.ENTITY_MENTIONS,
            INTERNAL_NODES: schema.RESOLVED_ENTITIES,
            INTERNAL_ENTITIES: schema.RESOLVED_ENTITIES}
TABLES = [t for t in schema.PUBLISHED if t != "runs"] + list(INTERNAL)


def _schema(table: str, dim: int) -> pa.Schema:
    return INTERNAL[table] if table in INTERNAL else schema.PUBLISHED[table](dim)


def published(snapshot: Path) -> dict[str, list[str]]:
    """Every table of a snapshot as sorted rows (JSON text), without the ignored columns."""
    dim = store.read_manifest(snapshot)["embedding"]["dim"]
    out = {}
    for table in TABLES:
        rows = store.read_table(snapshot, table, _schema(table, dim))
        keep = [c for c in rows.column_names if c not in IGNORED]
        out[table] = sorted(json.dumps(r, default=str, sort_keys=True)
                            for r in rows.select(keep).to_pylist())
    return out


def assert_same_graph(got: Path, want: Path) -> None:
    a, b = published(got), published(want)
    for table in TABLES:
        assert a[table] == b[table], (table, sorted(set(a[table]) ^ set(b[table]))[:6])
    dim = store.read_manifest(got)["embedding"]["dim"]
    for table, (key, vector) in VECTORS.items():
        vectors = []
        for snapshot in (got, want):
            rows = store.read_table(snapshot, table, schema.PUBLISHED[table](dim), [key, vector])
            vectors.append(dict(zip(rows[key].to_pylist(), rows[vector].to_pylist(),
                                    strict=True)))
        assert vectors[0].keys() == vectors[1].keys()
        for k, v in vectors[0].items():
            assert np.allclose(v, vectors[1][k], atol=1e-5), (table, k)


def _write(folder: Path, records: list[dict]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(folder)


def _records(path: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(path.glob("*.jsonl"))
            for line in f.read_text().splitlines() if line.strip()]


def _message(group: str, id_: str, day: str, speaker: str, content: str,
             conversation: str | None = None) -> dict:
    return {"group_id": group, "id": id_, "kind": "message", "timestamp": f"{day}T10:00:00Z",
            "conversation_id": conversation or f"c-{id_}", "speaker": speaker,
            "content": content}


def _record(group: str, id_: str, day: str, data: dict) -> dict:
    return {"group_id": group, "id": id_, "kind": "json", "timestamp": f"{day}T08:00:00Z",
            "source": "crm.contacts", "data": data}


# A small store with each hard case: a fact ended by a later episode (Berlin, then Paris),
# two entities merged by a third spelling (Sofia/Sophia/Sopia), an entity mentioned once
# (Acme), a record with three versions, a conversation, and a second group.
SMALL = [
    _message("inc", "m1", "2024-01-10", "Alice Chen", "Daniel Okafor lives in Berlin."),
    _message("inc", "m2", "2024-01-11", "Sofia Moreno", "Sofia Moreno lives in Madrid."),
    _message("inc", "m3", "2024-01-12", "Sophia Moreno", "Thanks, see you at the office."),
    _message("inc", "m4", "2024-02-10", "Alice Chen", "Alice Chen works at Acme."),
    _message("inc", "m5", "2024-03-10", "Sopia Moreno", "Thanks, see you at the office."),
    _message("inc", "m6", "2024-06-01", "Alice Chen", "Daniel Okafor moved to Paris."),
    _message("inc", "c1", "2024-04-01", "Bob Stone", "Bob Stone works at Globex.", "conv"),
    _message("inc", "c2", "2024-04-01", "Alice Chen", "Alice Chen met Bob Stone in Rome.",
             "conv"),
    _record("inc", "contact-7-v1", "2024-01-05", {"contact_id": "CON-7", "name": "Ivo Berg",
                                                  "company": "Initech", "city": "Oslo"}),
    _record("inc", "contact-7-v2", "2024-03-05", {"contact_id": "CON-7", "name": "Ivo Berg",
                                                  "company": "Globex", "city": "Oslo"}),
    _record("inc", "contact-7-v3", "2024-05-05", {"contact_id": "CON-7", "name": "Ivo Berg",
                                                  "company": "Globex", "city": "Bergen"}),
    _message("other", "o1", "2024-02-01", "Carla Diaz", "Carla Diaz lives in Lisbon."),
    _message("other", "o2", "2024-02-02", "Carla Diaz", "Carla Diaz works at Umbrella."),
]


@pytest.fixture(scope="module")
def small(ray_session, config, tmp_path_factory) -> tuple[Path, Path]:
    """The small store, built once: (store, folder of its input)."""
    root = tmp_path_factory.mktemp("forget-small")
    build(config, [_write(root / "in", SMALL)], root / "store", run_id="all")
    return root / "store", root


@pytest.fixture(scope="module")
def corpus(corpus_build, tmp_path_factory) -> tuple[Path, Path]:
    """The session's sample-corpus store (the same config and input; run ids are ignored),
    copied before it is forgotten from: (store, folder for the copies)."""
    return corpus_build.snapshot.parents[1], tmp_path_factory.mktemp("forget-corpus")


def _forget_equals_build_without(config, built: tuple[Path, Path], records: list[dict],
                                 selector: fg.Selector, gone: set[tuple[str, str]],
                                 name: str) -> fg.ForgetResult:
    """Forget `selector` on a copy of the built store; build the records less `gone`
    ((group, id) pairs) into a fresh store; the two publish the same graph."""
    source, root = built
    copy = root / f"copy-{name}"
    shutil.copytree(source, copy)
    result = fg.forget(config, copy, selector, by="test")
    assert not result.nothing and result.snapshot
    rest = [r for r in records if (r["group_id"], r["id"]) not in gone]
    assert len(rest) < len(records)
    without = root / f"without-{name}"
    build(config, [_write(root / f"in-{name}", rest)], without, run_id="all")
    assert_same_graph(store.current_snapshot(copy), store.current_snapshot(without))
    return result


def _ids(records: list[dict], keep) -> set[tuple[str, str]]:
    return {(r["group_id"], r["id"]) for r in records if keep(r)}


SMALL_CASES = {
    # the episode that ended a fact: Berlin is open again
    "ended_a_fact": (fg.Selector(episodes=(("inc", "m6"),)), lambda r: r["id"] == "m6"),
    # one alias of a merged entity: Sofia and Sophia are apart again
    "one_alias": (fg.Selector(episodes=(("inc", "m5"),)), lambda r: r["id"] == "m5"),
    # the only mention of an entity: Acme goes
    "only_mention": (fg.Selector(episodes=(("inc", "m4"),)), lambda r: r["id"] == "m4"),
    # a record version in the middle of its history
    "middle_version": (fg.Selector(episodes=(("inc", "contact-7-v2"),)),
                       lambda r: r["id"] == "contact-7-v2"),
    "conversation": (fg.Selector(episodes=(("inc", "c1"), ("inc", "c2"))),
                     lambda r: r.get("conversation_id") == "conv"),
    "source": (fg.Selector(sources=("crm.contacts",)), lambda r: r.get("source") ==
               "crm.contacts"),
    "group": (fg.Selector(groups=("other",)), lambda r: r["group_id"] == "other"),
    "date_cut": (fg.Selector(before=datetime(2024, 2, 1, tzinfo=UTC)),
                 lambda r: r["timestamp"] < "2024-02-01"),
}


@pytest.mark.parametrize("case", sorted(SMALL_CASES))
def test_forget_equals_a_build_without(config, small, case):
    selector, gone = SMALL_CASES[case]
    _forget_equals_build_without(config, small, SMALL, selector, _ids(SMALL, gone), case)


# A night after a forget: Sofia Moreno moves, the contact's company changes again.
LATER = [
    _message("inc", "m7", "2024-07-01", "Alice Chen", "Sofia Moreno moved to Lisbon."),
    _message("inc", "m8", "2024-07-02", "Sopia Moreno", "Thanks, see you at the office."),
    _record("inc", "contact-7-v4", "2024-07-03", {"contact_id": "CON-7", "name": "Ivo Berg",
                                                  "company": "Initech", "city": "Bergen"}),
]


@pytest.mark.parametrize("case", ["one_alias", "middle_version"])
def test_a_night_after_a_forget_equals_one_after_a_build_without(config, small, case):
    """What a forget leaves for the next night (the internal tables a later run keeps:
    mentions, name nodes, entity rows, name map, pairs) is what a build without the
    forgotten episodes leaves: the same night on both gives the same graph."""
    selector, gone = SMALL_CASES[case]
    source, root = small
    copy = root / f"night-{case}"
    shutil.copytree(source, copy)
    fg.forget(config, copy, selector, by="test")
    build(config, [_write(root / f"later-{case}", LATER)], copy, run_id="later")
    without = root / f"night-without-{case}"
    rest = [r for r in SMALL if (r["group_id"], r["id"]) not in _ids(SMALL, gone)]
    build(config, [_write(root / f"rest-{case}", rest)], without, run_id="all")
    build(config, [_write(root / f"later-{case}", LATER)], without, run_id="later")
    assert_same_graph(store.current_snapshot(copy), store.current_snapshot(without))


def test_forget_an_entity_with_its_episodes(config, small):
    mentioning = {("inc", "m1"), ("inc", "m6")}  # Daniel Okafor's episodes
    result = _forget_equals_build_without(
        config, small, SMALL, fg.Selector(entities=(("inc", "Daniel Okafor"),),
                                          with_episodes=True), mentioning, "entity")
    assert result.counts["episodes"] == 2


@pytest.mark.parametrize("seed", [1, 2])
def test_forget_random_episodes(config, small, seed):
    chosen = random.Random(seed).sample(SMALL, 3)
    selector = fg.Selector(episodes=tuple((r["group_id"], r["id"]) for r in chosen))
    _forget_equals_build_without(config, small, SMALL, selector,
                                 {(r["group_id"], r["id"]) for r in chosen}, f"random{seed}")


def test_forget_on_the_sample_corpus(config, corpus):
    """Maria Lopez's move (the episodes that ended WORKS_AT Initech) and a whole
    conversation, at once, on the project's sample corpus."""
    records = _records(CORPUS)
    gone = _ids(records, lambda r: r["id"] in ("acme-conv-2024-07-02-m02",
                                               "acme-conv-2024-07-02-m03")
                or r.get("conversation_id") == "acme-conv-2024-01-15")
    selector = fg.Selector(episodes=tuple(sorted(gone)))
    _forget_equals_build_without(config, corpus, records, selector, gone, "corpus")


def test_dry_run_counts_and_changes_nothing(config, small):
    source = small[0]
    before = store.current_run(source)
    result = fg.forget(config, source, fg.Selector(episodes=(("inc", "m4"),)), dry_run=True)
    assert store.current_run(source) == before
    assert result.counts["episodes"] == 1 and result.counts["entities"] >= 1, result.counts
    assert result.counts["facts_deleted"] >= 1, result.counts


def test_an_unknown_entity_is_an_error(config, small):
    with pytest.raises(fg.ForgetError, match="no entity"):
        fg.forget(config, small[0], fg.Selector(entities=(("inc", "Nobody Atall"),)),
                  dry_run=True)


def test_forget_publishes_every_table_a_build_publishes():
    """Forget drops a touched group's files of every table and writes what its own stages
    publish (`fg.PUBLISHED`), so a table a build publishes and forget does not would lose
    the touched groups' rows (`_record_statements` did: the next night lost their earlier
    record versions). Episodes are rewritten by forget's plan, without the erased ones."""
    from tkg.pipeline.build import PUBLISH

    assert set(PUBLISH.values()) - set(fg.PUBLISHED.values()) == {"episodes"}
