"""Erased means gone from the history too: canary words planted in an episode's content, a
speaker's name and a JSON field are found by a scan of every byte of every file under the
store (Parquet decoded, LanceDB tables at every version) before `forget --purge`, and
nowhere after it, across two snapshots; so are they by the same questions through the
Python API, the CLI, HTTP, MCP and the catalog's macros at several `as_of`/`known_at`
instants, and an answer at a `known_at` before the erasure says that erased data was
removed. A build and a forget on one store cannot interleave, and a forget
killed at its fault points leaves a consistent store that a rerun completes.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import re
import shutil
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tkg.pipeline import faults, index, lock, schema, storage, store
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


LANCE_TABLE = re.compile(r"^(.*/lance)/([^/]+)\.lance/")


def _lance_texts(folder: str, name: str) -> list[bytes]:
    """Every row of a LanceDB table, at every version it has."""
    table = index.connect(folder).open_table(name)
    out = []
    for version in table.list_versions():
        table.checkout(version["version"])
        rows = table.to_arrow()
        out.append(json.dumps(rows.drop_columns(
            [c for c in rows.column_names if c == "vector"]).to_pylist(), default=str).encode())
    return out


def scan(root: Path | str, words: tuple[str, ...]) -> dict[str, int]:
    """How many files (or LanceDB table versions) under a local folder or an object-store
    prefix hold each word, case-insensitive: every file's bytes, a Parquet file's decoded
    rows too (compressed pages would hide a word from a byte scan), and every row of every
    LanceDB table at each of its versions."""
    blobs, tables = [], set()
    for found, _ in storage.file_sizes(root):
        data = storage.read_bytes(found)
        blobs.append(data)
        if found.endswith(".parquet"):
            rows = pq.read_table(pa.BufferReader(data)).to_pylist()
            blobs.append(json.dumps(rows, default=str).encode())
        if match := LANCE_TABLE.match(found):
            tables.add(match.groups())
    for folder, name in sorted(tables):
        blobs += _lance_texts(folder, name)
    return {w: sum(w.lower().encode() in b.lower() for b in blobs) for w in words}


# Questions that find the erased episodes before the forget, and the instants they are asked
# at: now, the world on the day after the erased episode, what the store knew after each
# build (before the erasure: the answer must say that erased data was removed).
QUESTIONS = ("Where does Vexmoor Kallisandra live?", "fliptangerine")
WORLD = "2024-01-03T12:00:00+00:00"


def _instants(known: list[str]) -> list[dict[str, str]]:
    return [{}, {"as_of": WORLD}, *({"known_at": k} for k in known),
            {"as_of": WORLD, "known_at": known[-1]}]


def _found(body: dict[str, Any]) -> str:
    """A search answer's hits and warnings as text (not the question: it names a canary)."""
    return json.dumps({k: v for k, v in body.items() if k != "query"}, default=str)


def _catalog_answers(store_dir: Path, known: list[str]) -> list[str]:
    """The catalog's tables and macros at each instant (timestamps are the test's own)."""
    out = []
    with store.connect(store_dir) as con:
        sqls = ["SELECT * FROM facts_current", f"SELECT * FROM facts_as_of('{WORLD}')",
                "SELECT * FROM entity_history('Vexmoor Kallisandra')",
                "SELECT * FROM entity_history('Vexmoor Kallisandra', 'priv')",
                "SELECT * EXCLUDE (content_embedding) FROM episodes",
                "SELECT * EXCLUDE (name_embedding) FROM entities",
                "SELECT * FROM entity_aliases", "SELECT * FROM mentions",
                *(f"SELECT * FROM facts_known_at('{k}')" for k in known)]
        for sql in sqls:
            data = con.sql(sql).to_arrow_table()
            keep = [c for c in data.column_names if not c.endswith("embedding")]
            out.append(json.dumps(data.select(keep).to_pylist(), default=str))
    return out


class Interfaces:
    """The same questions through every way a store is read: the Python API, the CLI
    (`tkg search --json`), HTTP (`tkg serve`'s app) and MCP (`tkg mcp` over stdio, the SDK's
    client), each following the published snapshot; and the DuckDB catalog's macros."""

    def __init__(self, store_dir: Path, http: Any, mcp: Any) -> None:
        self.store_dir, self.http, self.mcp = store_dir, http, mcp

    async def ask(self, known: list[str]) -> dict[str, list[tuple[str, list[str]]]]:
        """interface -> (answer text, warnings) per question and instant."""
        from tkg.jobs.cli import main

        from tkg import query

        retriever = query.open(self.store_dir)
        out: dict[str, list[tuple[str, list[str]]]] = {"api": [], "cli": [], "http": [],
                                                        "mcp": []}
        for question in QUESTIONS:
            for instant in _instants(known):
                found = retriever.search(question, ["priv"], **instant).to_dict()
                out["api"].append((_found(found), found["warnings"]))
                answer = self.http.post("/search", json={"query": question,
                                                         "group_ids": ["priv"], **instant})
                assert answer.status_code == 200, answer.text
                out["http"].append((_found(answer.json()), answer.json()["warnings"]))
                called = await self.mcp.call_tool("search_memory", {
                    "query": question, "group_ids": ["priv"], **instant})
                assert not called.is_error, called.content
                body = called.structured_content
                out["mcp"].append((_found(body), body["warnings"]))
        for instant in _instants(known)[::2]:
            flags = [a for k, v in instant.items() for a in (f"--{k.replace('_', '-')}", v)]
            printed, warned = io.StringIO(), io.StringIO()
            # (not capsys: the MCP client hands sys.stderr to its server process)
            with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(warned):
                assert main(["search", "--store", str(self.store_dir), "--group", "priv",
                             "--query", QUESTIONS[0], "--json", *flags]) == 0
            out["cli"].append((_found(json.loads(printed.getvalue())), [
                line for line in warned.getvalue().splitlines() if "warning" in line]))
        out["catalog"] = [(text, []) for text in _catalog_answers(self.store_dir, known)]
        return out


def _mcp_server(store_dir: Path) -> Any:
    from mcp.client.stdio import StdioServerParameters

    return StdioServerParameters(command=sys.executable, args=[
        "-m", "tkg.jobs.cli", "mcp", "--store", str(store_dir)])


def _holding(answers: list[tuple[str, list[str]]], words: tuple[str, ...]) -> set[str]:
    return {w for text, _ in answers for w in words if w.lower() in text.lower()}


@pytest.fixture(scope="module")
def built_once(config, ray_session, tmp_path_factory) -> Path:
    """KEPT + ERASED built once (run r1), a store each test copies before it forgets."""
    root = tmp_path_factory.mktemp("forget-resumes")
    build(config, [_write(root / "in", KEPT + ERASED)], root / "store", run_id="r1")
    return root / "store"


def test_purge_leaves_no_canary_on_disk_or_in_any_answer(config, built_once, tmp_path):
    """The canary scan of every file, and the same questions through every interface at
    several instants: both find the erased data before `forget --purge` and nothing after;
    an answer at a `known_at` before the erasure says erased data was removed."""
    from fastapi.testclient import TestClient
    from mcp import Client
    from tkg.query.serve import create_app

    store_dir = tmp_path / "store"
    shutil.copytree(built_once, store_dir)  # run r1: KEPT + ERASED
    known = [datetime.now(UTC).isoformat()]  # what the store knew after each build
    build(config, [_write(tmp_path / "in2", LATER)], store_dir, run_id="r2")
    known.append(datetime.now(UTC).isoformat())
    # the caller's ids and the episode ids (uuid5 of group and id)
    ids = tuple(e["id"] for e in ERASED) + tuple(schema.stable_id("priv", e["id"])
                                                 for e in ERASED)
    words = CANARIES + ids
    before = scan(store_dir, words)
    assert all(before.values()), before  # the scan can fail: it finds them before
    selector = fg.Selector(episodes=tuple(("priv", e["id"]) for e in ERASED))

    async def before_and_after() -> tuple[dict, dict, fg.ForgetResult]:
        with TestClient(create_app(store_dir, watch=False)) as http:
            async with Client(_mcp_server(store_dir)) as mcp:
                interfaces = Interfaces(store_dir, http, mcp)
                asked = await interfaces.ask(known)
                result = await asyncio.to_thread(fg.forget, config, store_dir, selector,
                                                 by="dpo", purge=True)
                return asked, await interfaces.ask(known), result

    asked_before, asked_after, result = asyncio.run(before_and_after())
    assert result.retired == ["r1", "r2"] and result.work_dirs_removed >= 2
    after = scan(store_dir, words)
    print("canary scan before", before, "after", after)
    assert not any(after.values()), after
    for interface in asked_before:  # each interface found them before, and none after
        assert _holding(asked_before[interface], words), interface
        assert not _holding(asked_after[interface], words), interface
    for interface in ("api", "http", "mcp"):  # per question: now, as_of, known_at x2, both
        for at, (_, warnings) in enumerate(asked_after[interface]):
            erased = [w for w in warnings if "erased data was removed" in w]
            assert len(erased) == (at % 5 >= 2), (interface, at, warnings)
        assert not any("erased" in w for _, ws in asked_before[interface] for w in ws)
    cli_warnings = [w for _, ws in asked_after["cli"] for w in ws]  # now, known_at r1, both
    assert ["erased data was removed" in w for w in cli_warnings] == [True, True], cli_warnings
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
def test_a_killed_forget_resumes(config, built_once, tmp_path, monkeypatch, fault):
    store_dir = tmp_path / "store"
    shutil.copytree(built_once, store_dir)
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


def test_purge_on_object_storage_leaves_no_canary(config, s3, s3_config, ray_session,
                                                  tmp_path):
    """The same scan over every object of a store on the S3 test server: it finds the
    canaries and erased ids before `forget --purge`, none after."""
    store_dir = s3.url()
    storage.configure(s3_config.storage)
    try:
        build(s3_config, [_write(tmp_path / "in", KEPT + ERASED)], store_dir, run_id="r1")
        words = CANARIES + tuple(e["id"] for e in ERASED) + tuple(
            schema.stable_id("priv", e["id"]) for e in ERASED)
        before = scan(store_dir, words)
        assert all(before.values()), before
        selector = fg.Selector(episodes=tuple(("priv", e["id"]) for e in ERASED))
        result = fg.forget(s3_config, store_dir, selector, purge=True)
        assert result.retired == ["r1"] and store.current_run(store_dir) == result.snapshot
        after = scan(store_dir, words)
        print("S3 canary scan before", before, "after", after)
        assert not any(after.values()), after
        with store.connect(store_dir) as con:
            assert sorted(r[0] for r in con.execute("SELECT source_id FROM episodes")
                          .fetchall()) == ["m1", "m2"]
    finally:
        storage.configure(config.storage)


def test_the_lease_on_object_storage(config, s3, s3_config, monkeypatch):
    """On object storage the lock is a lease: a second holder is refused while it lives
    (its holder renews it), it is gone when its holder is done, and a crashed holder's
    expired lease is taken over."""
    store_dir = s3.url()
    path = storage.join(store_dir, lock.LOCK)
    monkeypatch.setattr(lock, "LEASE_S", 1.5)
    storage.configure(s3_config.storage)
    try:
        with lock.held(store_dir, "build", "night-1"):
            held = json.loads(storage.read_text(path))
            assert (held["what"], held["run_id"]) == ("build", "night-1")
            time.sleep(2.5)  # past the first expiry: renewed, still held
            assert json.loads(storage.read_text(path))["expires"] > held["expires"]
            with (pytest.raises(lock.StoreLocked, match="build night-1"),
                  lock.held(store_dir, "forget")):
                pass
        assert not storage.is_file(path)  # released
        crashed = {**held, "run_id": "crashed", "token": "gone", "expires": time.time() - 1}
        storage.write_text(path, json.dumps(crashed))
        with lock.held(store_dir, "forget", "f-1"):
            assert json.loads(storage.read_text(path))["run_id"] == "f-1"
        assert not storage.is_file(path)
    finally:
        storage.configure(config.storage)
