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


def _saved(lance: Path, name: str) -> dict[str, Any]:
    """What publish wrote for table `name`: its meta, unit vectors and postings by term."""
    saved = table_arrays.load(lance, name)
    assert saved is not None, name
    postings = saved.postings()
    by_term = None
    if postings is not None:
        start = postings["start"]
        by_term = {term: [(int(r), float(c), float(g)) for r, c, g in zip(
            *(postings[f][start[n]:start[n + 1]] for f in ("rows", "counts", "gains")),
            strict=True)] for term, n in postings["terms"].items() if start[n + 1] > start[n]}
    vectors = saved.vectors()
    return {"meta": saved.meta(), "vectors": None if vectors is None else np.array(vectors),
            "postings": by_term, "statistics": None if postings is None else
            [np.array(postings[f]) for f in ("lengths", "documents", "average_length")]}


def test_arrays_of_an_extended_table_are_those_read_whole(tmp_path, monkeypatch):
    """A publish that extends a table starts its arrays from those of the version it
    extends (kept rows' meta, unit vectors and postings; only added rows read and
    tokenized): the same rows, the same vector bits and, term by term, the same postings
    as arrays written from the whole extended table. The new vectors file is spliced from
    runs of the earlier file and the added rows (`_extended_vectors`)."""
    import pyarrow as pa
    from tkg.pipeline.index import Extendable, build_indexes

    streamed = []
    extended_vectors = table_arrays._extended_vectors

    def spliced(table, keys, earlier):
        pieces = extended_vectors(table, keys, earlier)
        streamed.append(pieces is not None)
        return pieces

    monkeypatch.setattr(table_arrays, "_extended_vectors", spliced)
    config = QueryConfig(ann_min_rows=10**9)
    tables, _ = _synthetic(tmp_path / "a", config)
    first = store.current_snapshot(tmp_path / "a")
    figures = store.read_manifest(first)["retrieval"]
    changed = {}
    for name in ("facts", "episodes", "entities"):
        table = tables[name]
        text = SPECS[name].text[-1]
        keep = pa.array(np.arange(table.num_rows) % 10 != 3)  # a tenth deleted
        edited = table.slice(0, 7).set_column(  # seven rows changed, so deleted and added
            table.schema.get_field_index(text), text,
            pa.array([f"changed text number {i}" for i in range(7)]))
        changed[name] = pa.concat_tables([table.slice(7).filter(keep[7:]), edited])
    second = store.prepare_snapshot(tmp_path / "a", "bench-2")
    bases = {name: Extendable(first / "lance", int(figures[name]["version"]),
                              int(figures[name]["appends"]), first / "lance")
             for name in changed}
    built = build_indexes(second, 32, config, tables={**tables, **changed}, bases=bases)
    assert streamed == [True] * len(changed)
    for name in changed:
        assert built[name]["extended"] and built[name]["added"] == 7, (name, built[name])
        table = connect(first / "lance").open_table(name)
        table.checkout(built[name]["version"])
        whole = tmp_path / "whole" / name
        table_arrays.write(whole, table, name, config, SPECS[name].order)
        extended, read = _saved(second / "lance", name), _saved(whole, name)
        assert extended["meta"].equals(read["meta"]), name
        assert np.array_equal(extended["vectors"], read["vectors"]), name
        assert extended["postings"] == read["postings"], name
        for a, b in zip(extended["statistics"], read["statistics"], strict=True):
            assert np.array_equal(a, b), name
