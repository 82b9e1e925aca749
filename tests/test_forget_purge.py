"""Erased means gone from the history too: canary words planted in an episode's content, a
speaker's name and a JSON field are found by a scan of every byte of every file under the
store (Parquet decoded, LanceDB tables at every version) before `forget --purge`, and
nowhere after it, across two snapshots; queries at a `known_at` before the erasure say that
erased data was removed. A build and a forget on one store cannot interleave, and a forget
killed at its fault points leaves a consistent store that a rerun completes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from tkg.pipeline import faults, lock, schema, store
from tkg.pipeline import forget as fg
from tkg.pipeline.build import build

CANARIES = ("zorblatquux", "Vexmoor Kallisandra", "fliptangerine")


def _write(folder: Path, records: list[dict]) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "episodes.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(folder)


def _message(id_: str, day: str, speaker: str, content: str) -> dict:
    return {"group_id": "priv", "id": id_, "kind": "message", "timestamp": f"{day}T10:00:00Z",
            "conversation_id": "c-1", "speaker": speaker, "content": content}


ERASED = [
    _message("canary-ep-7f3a", "2024-01-02", "Vexmoor Kallisandra",
             "Vexmoor Kallisandra lives in Zorblatquux City."),
    {"group_id": "priv", "id": "canary-rec-9b1c", "kind": "json",
     "timestamp": "2024-01-03T08:00:00Z", "source": "crm.contacts",
     "data": {"contact_id": "CON-99", "name": "Vexmoor Kallisandra",
              "note": "fliptangerine"}},
]
KEPT = [_message("m1", "2024-01-01", "Alice Chen", "Alice Chen works at Acme."),
        _message("m2", "2024-01-04", "Bob Stone", "Bob Stone lives in Berlin.")]
LATER = [_message("m3", "2024-02-01", "Alice Chen", "Alice Chen met Bob Stone in Rome.")]


def _texts(path: Path) -> list[bytes]:
    """The file's bytes, and for a Parquet file its decoded rows too (compressed pages
    would hide a word from a byte scan)."""
    out = [path.read_bytes()]
    if path.suffix == ".parquet":
        out.append(json.dumps(pq.read_table(path).to_pylist(), default=str).encode())
    return out


def _lance_texts(root: Path) -> list[bytes]:
    """Every row of every LanceDB table under `root`, at every version it has."""
    import lancedb

    out = []
    for folder in (f for f in root.rglob("lance/*.lance") if f.is_dir()):
        table = lancedb.connect(str(folder.parent)).open_table(folder.stem)
        for version in table.list_versions():
            table.checkout(version["version"])
            rows = table.to_arrow()
            out.append(json.dumps(rows.drop_columns(
                [c for c in rows.column_names if c == "vector"]).to_pylist(),
                default=str).encode())
    return out


def scan(root: Path, words: tuple[str, ...]) -> dict[str, int]:
    """How many files (or LanceDB table versions) hold each word, case-insensitive."""
    blobs = [t for f in root.rglob("*") if f.is_file() for t in _texts(f)]
    blobs += _lance_texts(root)
    return {w: sum(w.lower().encode() in b.lower() for b in blobs) for w in words}


def test_purge_leaves_no_canary_on_disk(config, ray_session, tmp_path):
    store_dir = tmp_path / "store"
    build(config, [_write(tmp_path / "in1", KEPT + ERASED)], store_dir, run_id="r1")
    build(config, [_write(tmp_path / "in2", LATER)], store_dir, run_id="r2")
    # the caller's ids and the episode ids (uuid5 of group and id)
    ids = tuple(e["id"] for e in ERASED) + tuple(schema.stable_id("priv", e["id"])
                                                 for e in ERASED)
    words = CANARIES + ids
    before = scan(store_dir, words)
    assert all(before.values()), before  # the scan can fail: it finds them before
    selector = fg.Selector(episodes=tuple(("priv", e["id"]) for e in ERASED))
    result = fg.forget(config, store_dir, selector, by="dpo", purge=True)
    assert result.retired == ["r1", "r2"] and result.work_dirs_removed >= 2
    after = scan(store_dir, words)
    print("canary scan before", before, "after", after)
    assert not any(after.values()), after
    # the erasure log confirms an id it was asked about, and holds none in clear
    assert fg.was_erased(store_dir, "priv", "canary-ep-7f3a")
    assert not fg.was_erased(store_dir, "priv", "m1")
    # what was not erased is all there
    with store.connect(store_dir) as con:
        assert sorted(r[0] for r in con.execute("SELECT source_id FROM episodes").fetchall()) \
            == ["m1", "m2", "m3"]


def test_a_build_and_a_forget_cannot_interleave(tmp_path):
    with (lock.held(tmp_path, "build", "night-1"),
          pytest.raises(lock.StoreLocked, match="build night-1"),
          lock.held(tmp_path, "forget")):
        pass
    with lock.held(tmp_path, "forget"):  # released when the holder is done
        pass


@pytest.mark.parametrize("fault", ["after_stage:forget_versions", "publish:indexes",
                                   "forget:published"])
def test_a_killed_forget_resumes(config, ray_session, tmp_path, monkeypatch, fault):
    store_dir = tmp_path / "store"
    build(config, [_write(tmp_path / "in", KEPT + ERASED)], store_dir, run_id="r1")
    selector = fg.Selector(episodes=(("priv", "canary-ep-7f3a"),))
    monkeypatch.setenv(faults.ENV, fault)
    with pytest.raises(faults.InjectedCrash):
        fg.forget(config, store_dir, selector, purge=True)
    published = store.current_run(store_dir)
    assert published == ("r1" if fault != "forget:published" else published)
    store.read_manifest(store.current_snapshot(store_dir))  # a whole snapshot either way
    monkeypatch.delenv(faults.ENV)
    fg.forget(config, store_dir, selector, purge=True)
    assert scan(store_dir, ("zorblatquux",)) == {"zorblatquux": 0}
    assert not (store_dir / "snapshots" / "r1" / store.MANIFEST).exists()  # retired
