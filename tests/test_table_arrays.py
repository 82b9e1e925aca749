"""What publish computes for an open (pipeline/table_arrays.py): a snapshot opened from the
files publish wrote beside its LanceDB tables holds the same rows, unit vectors and BM25
postings, bit for bit, and answers the same, as one opened the old way (the files removed:
a snapshot published before them), locally and on an S3 store."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
from tkg.pipeline import schema, storage, store, table_arrays
from tkg.pipeline.config import QueryConfig
from tkg.pipeline.index import SPECS, connect
from tkg.query.snapshot import Snapshot, open_snapshot


def _synthetic(root: Path, config: QueryConfig) -> tuple[dict, Any]:
    from tkg.jobs.bench.query import synth_tables, write_store

    tables, centroids = synth_tables(3_000, 32, 3, seed=4)
    write_store(root, tables, 32, config)
    return tables, centroids


def _without_arrays(root: Path, target: Path) -> Path:
    """A copy of the store as a snapshot published before the files existed."""
    shutil.copytree(root, target)
    for folder in (store.current_snapshot(target) / "lance").glob("*" + table_arrays.SUFFIX):
        shutil.rmtree(folder)
    return target


def _assert_same(mapped: Snapshot, computed: Snapshot) -> None:
    for name in SPECS:
        a, b = mapped.kinds[name], computed.kinds[name]
        assert a.meta.schema == b.meta.schema and a.meta.equals(b.meta), name
        assert (a.vectors is None) == (b.vectors is None), name
        if a.vectors is not None:
            assert a.vectors.dtype == b.vectors.dtype and np.array_equal(a.vectors, b.vectors)
        assert (a.terms is None) == (b.terms is None), name
        if a.terms is not None:
            assert a.terms.terms == b.terms.terms, name
            for field in table_arrays.POSTINGS:
                x, y = getattr(a.terms, field), getattr(b.terms, field)
                assert x.dtype == y.dtype and np.array_equal(x, y), (name, field)
    assert mapped.groups == computed.groups


def test_a_snapshot_opened_from_publish_arrays_answers_as_one_computed(tmp_path):
    from tkg.jobs.bench.query import SyntheticEmbedder

    from tkg import query

    config = QueryConfig(ann_min_rows=10**9)
    tables, centroids = _synthetic(tmp_path / "a", config)
    lance = store.current_snapshot(tmp_path / "a") / "lance"
    for name in SPECS:  # (communities: 12 rows, still kept)
        assert (table_arrays.folder(lance, name) / table_arrays.INDEX).is_file(), name
    mapped = open_snapshot(store.current_snapshot(tmp_path / "a"), config)
    assert isinstance(mapped.kinds["facts"].vectors.base, np.memmap)  # mapped, not read
    old = _without_arrays(tmp_path / "a", tmp_path / "b")
    _assert_same(mapped, open_snapshot(store.current_snapshot(old), config))

    embedder = SyntheticEmbedder(centroids)
    new_way = query.open(tmp_path / "a", embedder=embedder, config=config)
    old_way = query.open(old, embedder=embedder, config=config)
    for i in range(0, 3_000, 250):
        text = " ".join(tables["facts"]["fact"][i].as_py().split()[:4])
        group = tables["facts"]["group_id"][i].as_py()
        assert (new_way.search(text, [group]).to_dict()
                == old_way.search(text, [group]).to_dict()), text


def test_a_table_too_large_for_memory_writes_only_its_rows(tmp_path):
    """Under a config that keeps neither vectors nor postings, publish writes the rows
    alone, and the open computes nothing it would not have."""
    config = QueryConfig(ann_min_rows=10**9, memory_vector_rows=0, memory_text_rows=0)
    _synthetic(tmp_path, config)
    snapshot = store.current_snapshot(tmp_path)
    listed = table_arrays.load(snapshot / "lance", "facts", 3_000)
    assert listed is not None and set(listed.listed) == {"rows", "meta"}
    opened = open_snapshot(snapshot, config)
    assert opened.kinds["facts"].vectors is None and opened.kinds["facts"].terms is None


def test_arrays_written_and_read_on_an_s3_store(s3, monkeypatch, tmp_path):
    """On object storage the files are written by upload and read whole."""
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    config = QueryConfig(ann_min_rows=10**9)
    _synthetic(tmp_path / "a", config)
    local = _without_arrays(tmp_path / "a", tmp_path / "b")
    for name, table_schema in schema.PUBLISHED.items():  # (an open on S3 views them all)
        if not (store.current_snapshot(local) / name).exists():
            store.write_empty(store.current_snapshot(local) / name, table_schema(32))
    remote = s3.url()
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        storage.write_bytes(storage.join(remote, *path.relative_to(local).parts),
                            path.read_bytes())
    snapshot = store.current_snapshot(remote)
    lance = storage.join(snapshot, "lance")
    assert table_arrays.load(lance, "facts", 3_000) is None  # (published before them)
    computed = open_snapshot(snapshot, config)
    db = connect(lance)
    for name in SPECS:
        table_arrays.write(lance, db.open_table(name), name, config, SPECS[name].order)
    assert table_arrays.load(lance, "facts", 3_000) is not None
    _assert_same(open_snapshot(snapshot, config), computed)
