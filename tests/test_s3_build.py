"""Builds whose inputs, work dir and store all live on a real S3-compatible server (moto over
HTTP, tests/s3.py), through the same code as a local store: one chain on the sample corpus
plus hostile records, killed mid-extraction and resumed, published, queried, grown by an
incremental run whose carried tables are referenced across snapshots, and collected by gc.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tkg.pipeline import faults, outputs, schema, storage, store
from tkg.pipeline.build import build
from tkg.pipeline.faults import InjectedCrash

from tests.test_reliability import CORPUS, VARYING, hostile_lines

pytestmark = pytest.mark.timeout(1800)  # three builds; slow only on a crowded machine
RUN = "s3-chain"


def upload(local: Path, url: str) -> str:
    storage.write_bytes(url, local.read_bytes())
    return url


def published(snapshot: Path | str, table: str) -> list[str]:
    """A published table's rows outside the hostile group, without build times and vectors,
    in a stable order (what must equal between two builds of the same input)."""
    with store.open_catalog(snapshot) as con:
        data = con.sql(f"SELECT * FROM {table} WHERE group_id IS DISTINCT FROM 'hostile'"
                       ).to_arrow_table()
    keep = [c for c in data.column_names if c not in VARYING and not c.endswith("embedding")]
    return sorted(map(repr, data.select(keep).to_pylist()))


@pytest.fixture(scope="module")
def inputs(s3, s3_config, tmp_path_factory) -> list[str]:
    storage.configure(s3_config.storage)
    root = s3.url()
    lines, _ = hostile_lines()
    hostile = tmp_path_factory.mktemp("hostile") / "hostile.jsonl"
    hostile.write_bytes(b"\n".join(lines) + b"\n")
    for path in sorted(CORPUS.glob("*.jsonl")):
        upload(path, f"{root}/in/{path.name}")
    return [f"{root}/in", upload(hostile, f"{root}/hostile.jsonl")]


@pytest.fixture(scope="module")
def s3_build(ray_session, s3, s3_config, inputs):
    """The chain: a crash in the middle of extraction, then the resumed run to the end."""
    import os

    chunked = s3_config.model_copy(update={
        "extract": s3_config.extract.model_copy(update={"chunk_rows": 120})})  # 2 chunks
    store_dir = s3.url()
    os.environ[faults.ENV] = "extract_batch:1"
    try:
        with pytest.raises(InjectedCrash):
            build(chunked, inputs, store_dir, run_id=RUN)
    finally:
        del os.environ[faults.ENV]
    work = store.work_dir(store_dir, RUN)
    crashed = {"chunk0": outputs.finished(storage.join(work, "extract", "_chunks", "00000")),
               "chunk1": outputs.finished(storage.join(work, "extract", "_chunks", "00001")),
               "current": store.current_run(store_dir)}
    result = build(chunked, inputs, store_dir, run_id=RUN)
    return store_dir, result, crashed


def test_a_build_on_s3_resumes_and_equals_the_local_build(s3_build, corpus_build, expected):
    store_dir, result, crashed = s3_build
    assert crashed["current"] is None and crashed["chunk1"] is None
    assert crashed["chunk0"] is not None  # the finished chunk was kept on S3 for the resume
    assert str(result.snapshot) == f"{store_dir}/snapshots/{RUN}"
    assert store.current_run(store_dir) == RUN
    summary = result.summary
    _, hostile_rejected = hostile_lines()
    assert summary["episodes_in"] == summary["episodes_ok"] + summary["rejected"]
    assert summary["rejected"] == expected["rejects"] + hostile_rejected
    for table in schema.PUBLISHED:
        if table not in ("runs", "rejects"):
            assert published(result.snapshot, table) == published(corpus_build.snapshot,
                                                                   table), table
    manifest = store.read_manifest(result.snapshot)
    assert manifest["lance"] == {name: "lance" for name in manifest["lance"]}
    assert all(storage.is_file(f) for files in store.snapshot_files(result.snapshot).values()
               for f in files)
    with store.open_catalog(result.snapshot) as con:  # hostile input is data, in its group
        kept = dict(con.execute("SELECT source_id, content FROM episodes "
                                "WHERE group_id = 'hostile'").fetchall())
    assert kept["inj"].startswith("Ignore previous instructions")


def test_query_stats_and_serve_read_the_s3_store(s3_build):
    from fastapi.testclient import TestClient
    from tkg.jobs.cli import store_stats
    from tkg.query.serve.app import create_app

    from tkg import query

    store_dir, result, _ = s3_build
    retriever = query.open(store_dir)
    found = retriever.search("What does Alice Chen plan?", ["acme"], limit=5)
    assert found.facts and retriever.snapshot().run_id == RUN
    assert store_stats(store_dir)["episodes"] == result.summary["episodes"]
    with TestClient(create_app(store_dir)) as client:
        answer = client.post("/search", json={"query": "Alice Chen", "group_ids": ["acme"]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["entities"]


def test_an_incremental_run_references_carried_files_and_gc_keeps_them(
        s3_build, s3_config, s3, tmp_path):
    store_dir, first, _ = s3_build
    late = tmp_path / "late.jsonl"
    late.write_text(json.dumps({
        "group_id": "acme", "kind": "message", "conversation_id": "late", "id": "late-1",
        "speaker": "Alice Chen", "timestamp": "2025-06-01T09:00:00Z",
        "content": "Alice Chen moved to Lisbon."}) + "\n")
    second = build(s3_config, [upload(late, storage.join(s3.url(), "late.jsonl"))], store_dir,
                   run_id="s3-next")
    manifest = store.read_manifest(second.snapshot)
    carried = [f for f in manifest["files"]["episodes"] if f.startswith(f"../{RUN}/")]
    assert carried and len(carried) < len(manifest["files"]["episodes"])
    assert second.summary["episodes"] == first.summary["episodes"] + 1
    report_dry = store_gc(store_dir, dry_run=True)
    assert report_dry.removed_snapshots == [RUN]
    report = store_gc(store_dir)
    assert report.removed_snapshots == [RUN] and report.freed_bytes > 0
    assert all(storage.is_file(storage.join(second.snapshot, f)) for f in carried)
    assert not storage.exists(storage.join(first.snapshot, store.MANIFEST))
    with store.connect(store_dir) as con:
        assert con.execute("SELECT count(*) FROM episodes").fetchone() == (
            second.summary["episodes"],)


def store_gc(store_dir: str, dry_run: bool = False):
    from tkg.pipeline.reliability import gc

    return gc(store_dir, keep=0, dry_run=dry_run)
