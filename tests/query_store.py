"""A tiny hand-built store for retrieval tests: Parquet tables written directly (no Ray),
two runs' worth of fact versions (so `known_at` has a past to see), two tenants."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from tkg.pipeline import schema, store
from tkg.pipeline.config import QueryConfig, TkgConfig

T1 = datetime(2025, 1, 10, tzinfo=UTC)  # first run: Ana lives in Porto
T2 = datetime(2025, 6, 10, tzinfo=UTC)  # second run: she moved to Lisbon in March 2024


def day(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def eid(group: str, name: str) -> str:
    return schema.stable_id(group, name)


ENTITIES = [  # group, name, labels, summary
    ("g1", "Ana Silva", ["Person"], "Ana Silva is an engineer."),
    ("g1", "Porto", ["Place"], "A city in the north of Portugal."),
    ("g1", "Lisbon", ["Place"], "The capital of Portugal."),
    ("g1", "Initech", ["Organization"], "A software company."),
    ("g1", "Bruno Costa", ["Person"], "Ana's colleague at Initech."),
    ("g2", "Ana Silva", ["Person"], "A different Ana, in another tenant."),
    ("g2", "Secret Corp", ["Organization"], "The other tenant's employer."),
]
EPISODES = [  # group, source_id, content, valid_at, created_at
    ("g1", "m1", "Ana Silva lives in Porto.", "2024-01-05", T1),
    ("g1", "m2", "Ana Silva works at Initech as an engineer.", "2024-01-06", T1),
    ("g1", "m3", "Bruno Costa works at Initech too.", "2024-01-07", T1),
    ("g1", "m4", "Ana Silva moved to Lisbon in March 2024.", "2025-05-01", T2),
    ("g2", "x1", "Ana Silva works at Secret Corp on project Nightingale.", "2024-02-01", T1),
]
FACTS = [  # group, edge key, version, src, relation, tgt, fact, episodes, valid, invalid,
    #         created, expired
    ("g1", "porto", 1, "Ana Silva", "LIVES_IN", "Porto", "Ana Silva lives in Porto.", ["m1"],
     "2024-01-05", None, T1, T2),
    ("g1", "porto", 2, "Ana Silva", "LIVES_IN", "Porto", "Ana Silva lives in Porto.", ["m1"],
     "2024-01-05", "2024-03-01", T2, None),
    ("g1", "lisbon", 1, "Ana Silva", "LIVES_IN", "Lisbon", "Ana Silva moved to Lisbon.",
     ["m4"], "2024-03-01", None, T2, None),
    ("g1", "initech", 1, "Ana Silva", "WORKS_AT", "Initech", "Ana Silva works at Initech.",
     ["m2"], "2024-01-06", None, T1, None),
    ("g1", "bruno", 1, "Bruno Costa", "WORKS_AT", "Initech", "Bruno Costa works at Initech.",
     ["m3"], "2024-01-07", None, T1, None),
    ("g2", "secret", 1, "Ana Silva", "WORKS_AT", "Secret Corp",
     "Ana Silva works at Secret Corp.", ["x1"], "2024-02-01", None, T1, None),
]


def _write(snapshot: Path, name: str, rows: list[dict], table_schema: pa.Schema) -> None:
    folder = snapshot / name
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=table_schema), folder / "part-0.parquet")


def build_store(root: Path, embedder, config: TkgConfig | None = None) -> Path:
    """Write the snapshot, its retrieval indexes and manifest (of `config`, else the
    default one), and publish it."""
    from tkg.pipeline.index import build_indexes

    dim = embedder.dim
    snapshot = store.prepare_snapshot(root, "tiny-1")

    def vec(texts: list[str]) -> list[list[float]]:
        return [v.tolist() for v in embedder.embed(texts)]

    ents = [{"entity_id": eid(g, n), "group_id": g, "name": n, "labels": lab, "summary": s,
             "created_at": T1, "first_seen": day("2024-01-05"), "last_seen": T1,
             "mention_count": 1}
            for g, n, lab, s in ENTITIES]
    for row, v in zip(ents, vec([r["name"] for r in ents]), strict=True):
        row["name_embedding"] = v
    eps = [{"episode_id": eid(g, s), "group_id": g, "source_id": s, "kind": "message",
            "conversation_id": f"{g}-c", "speaker": "Ana Silva", "content": c,
            "valid_at": day(v), "created_at": cr} for g, s, c, v, cr in EPISODES]
    for row, v in zip(eps, vec([r["content"] for r in eps]), strict=True):
        row["content_embedding"] = v
    facts = [{"edge_id": eid(g, k), "version": ver, "group_id": g,
              "source_entity_id": eid(g, s), "relation": rel, "target_entity_id": eid(g, t),
              "fact": f, "episode_ids": [eid(g, e) for e in ep], "valid_at": day(va),
              "invalid_at": day(inv) if inv else None, "created_at": cr, "expired_at": ex}
             for g, k, ver, s, rel, t, f, ep, va, inv, cr, ex in FACTS]
    for row, v in zip(facts, vec([r["fact"] for r in facts]), strict=True):
        row["fact_embedding"] = v
    mentions = [{"episode_id": eid(g, ep), "entity_id": eid(g, name), "group_id": g}
                for g, ep, name in [("g1", "m1", "Ana Silva"), ("g1", "m1", "Porto"),
                                    ("g1", "m2", "Ana Silva"), ("g1", "m2", "Initech"),
                                    ("g1", "m3", "Bruno Costa"), ("g1", "m3", "Initech"),
                                    ("g1", "m4", "Ana Silva"), ("g1", "m4", "Lisbon"),
                                    ("g2", "x1", "Ana Silva"), ("g2", "x1", "Secret Corp")]]
    _write(snapshot, "entities", ents, schema.entities(dim))
    _write(snapshot, "episodes", eps, schema.episodes(dim))
    _write(snapshot, "facts", facts, schema.facts(dim))
    _write(snapshot, "mentions", mentions, schema.MENTIONS)
    store.write_empty(snapshot / "communities", schema.communities(dim))
    config = config or TkgConfig()
    build_indexes(snapshot, dim, QueryConfig())
    store.write_manifest(snapshot, {"run_id": "tiny-1", "config": config.model_dump(),
                                    "embedding": {"model": config.embed.model, "dim": dim}})
    store.switch_current(root, "tiny-1")
    return root


def synthetic_snapshot(root: Path, seed: int) -> tuple[dict[str, pa.Table], Any, Any,
                                                      QueryConfig]:
    """The benchmark's synthetic store (3,000 facts, 3 groups, 32-d), opened: its tables,
    topic centroids, snapshot and config. No vector index, so LanceDB searches exactly too
    (what the in-memory twins are compared with)."""
    from tkg.jobs.bench.query import synth_tables, write_store
    from tkg.query.snapshot import open_snapshot

    config = QueryConfig(ann_min_rows=10**9)
    tables, centroids = synth_tables(3_000, 32, 3, seed=seed)
    write_store(root, tables, 32, config)
    return tables, centroids, open_snapshot(store.current_snapshot(root), config), config


def twin_scopes() -> list[Any]:
    """Scopes an in-memory search must honour as LanceDB's prefilter does: one group, two
    groups, a past point of both timelines, a valid-time window, relation and label
    filters (a label every entity carries, and one none does)."""
    from tkg.jobs.bench.query import RELATIONS
    from tkg.query import search

    return [search.make_scope(["g000"]), search.make_scope(["g001", "g002"]),
            search.make_scope(["g000"], as_of="2021-06-01", known_at="2024-06-01"),
            search.make_scope(["g002"], filters=search.Filters(
                valid_from=datetime(2021, 1, 1, tzinfo=UTC))),
            search.make_scope(["g000"], filters=search.Filters(relations=RELATIONS[:2],
                                                               labels=("Thing",))),
            search.make_scope(["g000", "g002"], filters=search.Filters(labels=("Person",)))]
