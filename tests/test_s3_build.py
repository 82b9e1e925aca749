"""A store whose inputs, work dir and snapshots all live on a real S3-compatible server (moto
over HTTP, tests/s3.py), built by the chain of tests/cluster_build.py (fixture
`cluster_chain`): the sample corpus plus hostile records, killed mid-extraction and resumed on
a multi-node cluster, then grown by an incremental run. Here: the resumed build equals the
single-node local build, hostile input is rejected or kept as data, the store is queried and
served over s3://, the incremental run references carried files across snapshots, and gc keeps
exactly the files a kept manifest lists.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tkg.pipeline import schema, storage, store

from tests.cluster_build import LATER_RUN, RUN
from tests.test_reliability import VARYING, hostile_lines


@pytest.fixture(autouse=True)
def s3_storage(s3_config):
    """Every test reads the S3 server (a local build in between configures no endpoint)."""
    storage.configure(s3_config.storage)

def published(snapshot: Path | str, table: str) -> list[str]:
    """A published table's rows outside the hostile group, without build times and vectors,
    in a stable order (what must equal between two builds of the same input)."""
    with store.open_catalog(snapshot) as con:
        data = con.sql(f"SELECT * FROM {table} WHERE group_id IS DISTINCT FROM 'hostile'"
                       ).to_arrow_table()
    keep = [c for c in data.column_names if c not in VARYING and not c.endswith("embedding")]
    return sorted(map(repr, data.select(keep).to_pylist()))


def test_the_resumed_s3_build_equals_the_local_build(cluster_chain, corpus_build, expected):
    """Rows and ids of every published table (outside the hostile group) equal the local
    single-node build's; every file the manifest lists is on S3; LanceDB indexes there."""
    snapshot = storage.join(cluster_chain.store, "snapshots", RUN)
    manifest = store.read_manifest(snapshot)
    summary = manifest["summary"]
    _, hostile_rejected = hostile_lines()
    assert summary["episodes_in"] == summary["episodes_ok"] + summary["rejected"]
    assert summary["rejected"] == expected["rejects"] + hostile_rejected
    for table in schema.PUBLISHED:
        if table not in ("runs", "rejects"):
            assert published(snapshot, table) == published(corpus_build.snapshot, table), table
    assert manifest["lance"] == {name: "lance" for name in manifest["lance"]}
    assert all(storage.is_file(f) for files in store.snapshot_files(snapshot).values()
               for f in files)
    with store.open_catalog(snapshot) as con:  # hostile input is data, in its group
        kept = dict(con.execute("SELECT source_id, content FROM episodes "
                                "WHERE group_id = 'hostile'").fetchall())
    assert kept["inj"].startswith("Ignore previous instructions")


def test_query_stats_and_serve_read_the_s3_store(cluster_chain):
    from fastapi.testclient import TestClient
    from tkg.jobs.cli import store_stats
    from tkg.query.serve.app import create_app

    from tkg import query

    store_dir = cluster_chain.store
    retriever = query.open(store_dir)
    found = retriever.search("What does Alice Chen plan?", ["acme"], limit=5)
    assert found.facts and retriever.snapshot().run_id == LATER_RUN
    summary = store.read_manifest(store.current_snapshot(store_dir))["summary"]
    assert store_stats(store_dir)["episodes"] == summary["episodes"]
    with TestClient(create_app(store_dir)) as client:
        answer = client.post("/search", json={"query": "Alice Chen", "group_ids": ["acme"]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["entities"]


def test_an_incremental_run_references_carried_files_and_gc_keeps_them(cluster_chain):
    """Runs last of this module: gc removes the first snapshot."""
    from tkg.pipeline.reliability import gc

    store_dir = cluster_chain.store
    first = storage.join(store_dir, "snapshots", RUN)
    second = store.current_snapshot(store_dir)
    manifest = store.read_manifest(second)
    carried = [f for f in manifest["files"]["episodes"] if f.startswith(f"../{RUN}/")]
    assert carried and len(carried) < len(manifest["files"]["episodes"])
    assert manifest["summary"]["episodes"] == store.read_manifest(first)["summary"][
        "episodes"] + 1
    assert gc(store_dir, keep=0, dry_run=True).removed_snapshots == [RUN]
    report = gc(store_dir, keep=0)
    assert report.removed_snapshots == [RUN] and report.freed_bytes > 0
    assert all(storage.is_file(storage.join(second, f)) for f in carried)
    assert not storage.exists(storage.join(first, store.MANIFEST))
    with store.connect(store_dir) as con:
        assert con.execute("SELECT count(*) FROM episodes").fetchone() == (
            manifest["summary"]["episodes"],)
