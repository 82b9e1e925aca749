"""The rough edges an operator hits (issue 28's list), each on the real component: the build's
first line and its resumed stages, reject reasons with their limits, inputs that say nothing
or are skipped, timestamps far in the future, `tkg gc --keep`, a closed pipe, the search
command's dates and speakers, `tkg keys list|revoke`, one group default over GET, POST and
MCP, fact history's ids, `/docs` without a fixed port, `tkg mcp` with a wrong key, the MCP
tools' parameters, the snapshot-switch log line, `python -m tkg...` from a checkout without
an install, and `entity_history(alias, group)`."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import subprocess
import sys
import sysconfig
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from tkg.jobs import build_output
from tkg.jobs.cli import main
from tkg.pipeline import reliability, schema, sources, store
from tkg.pipeline.config import LimitsConfig
from tkg.query import keys as api_keys

ROOT = Path(__file__).resolve().parents[1]
TKG = [sys.executable, "-m", "tkg.jobs.cli"]
NOW = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def record(id_: str, timestamp: str = "2024-03-01T10:00:00Z", content: str = "hello",
           group: str = "g") -> dict[str, Any]:
    return {"group_id": group, "id": id_, "kind": "message", "timestamp": timestamp,
            "conversation_id": "c1", "speaker": "Alice Chen", "content": content}


def read(path: Path, limits: LimitsConfig | None = None) -> tuple[pa.Table, pa.Table]:
    episodes, rejects, _ = sources.read_file(path, run_id="r", limits=limits or LimitsConfig(),
                                             created_at=NOW)
    return episodes, rejects


# --- the build's console ---------------------------------------------------------------


def test_reject_reason_keeps_its_limit(tmp_path):
    """A reason as the reader writes it, through the summary's grouping: the limit whole
    (cut at 60 characters, 'over the limit of 100000' read 'over the limit of 1000')."""
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(record(f"m{i}", content="x" * (150_000 + i))) + "\n"
                            for i in range(3)) + "not json\n")
    _, rejects = read(path)
    kinds = [build_output.reason_kind(r) for r in rejects["reason"].to_pylist()]
    assert kinds.count("field 'content' is N characters, over the limit of 100000") == 3
    assert "malformed JSON" in kinds
    line = build_output.accepted_line({"episodes_ok": 0, "rejected": 4},
                                      {k: kinds.count(k) for k in set(kinds)})
    assert "over the limit of 100000 (3)" in line


def test_stage_lines_mark_resumed_stages(tmp_path):
    """Stages whose markers were there before the run began are '(resumed)'; one the run
    finishes is not."""
    import io

    from tkg.pipeline import outputs

    work = tmp_path / "work" / "r1"
    outputs.mark_finished(work / "read", {"seconds": 3.5})
    stream = io.StringIO()
    with build_output.StageProgress(stream, work, ["read", "window", "extract"]) as shown:
        outputs.mark_finished(work / "window", {"seconds": 1.25})
        deadline = time.monotonic() + 30
        while "window" not in shown.shown and time.monotonic() < deadline:
            time.sleep(0.05)
    lines = stream.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["read", "window"]
    assert lines[0].endswith("(resumed)") and "3.5 s" in lines[0]
    assert not lines[1].endswith("(resumed)")


def test_build_names_its_run_before_ray_starts(tmp_path):
    """The first line names the run id (to resume with) and comes before Ray is started: a
    store without the disk the build needs stops the build there, after the line."""
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps(record("m1")) + "\n")
    config = tmp_path / "config.yaml"
    config.write_text("limits: {min_free_mb: 1000000000}\n")  # no disk is that big
    started = time.monotonic()
    done = subprocess.run([*TKG, "build", "--config", str(config), "--input", str(data),
                           "--store", str(tmp_path / "store"), "--run-id", "night-7"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    seconds = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith("tkg build: run night-7, 1 input file into ")
    assert "--run-id night-7" in first and "tkg.log" in first
    assert "Traceback" not in done.stderr and "disk" in done.stderr
    print(f"first line and refusal after {seconds:.1f} s (Ray never started)")


def test_skipped_files_and_empty_inputs_are_said(tmp_path):
    """A folder gives its JSON Lines and Parquet files; the rest is named in a warning, and
    an input with no record, or with every record rejected, is said too."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.jsonl").write_text(json.dumps(record("m1")) + "\n")
    (folder / "records.json").write_text("[]")
    (folder / ".DS_Store").write_bytes(b"\0")
    assert sources.discover([str(folder)]) == [(folder / "a.jsonl").resolve()]
    assert sources.skipped([str(folder)]) == [folder / "records.json"]
    assert sources.skipped([str(folder / "a.jsonl")]) == []
    with pytest.raises(sources.InputError, match="not a supported file type"):
        sources.discover([str(folder / "records.json")])
    skipped, empty, rejected = (
        build_output.input_warnings({"episodes_in": 1, "episodes_ok": 1},
                                    sources.skipped([str(folder)])),
        build_output.input_warnings({"episodes_in": 0, "episodes_ok": 0}, []),
        build_output.input_warnings({"episodes_in": 2, "episodes_ok": 0, "rejected": 2}, []))
    assert len(skipped) == 1 and "records.json" in skipped[0] and ".DS_Store" not in skipped[0]
    assert empty == ["the input holds no record: the snapshot published adds nothing "
                     "(check --input: empty files, or the wrong folder)"]
    assert "every record was rejected (2)" in rejected[0]


def test_timestamps_far_in_the_future_are_rejected(tmp_path):
    """Year 3024 is rejected with the reason and the setting; a day ahead passes under the
    default (2 days) and not under `limits.future_days: 0.5`."""
    path = tmp_path / "future.jsonl"
    tomorrow = (NOW + timedelta(days=1)).isoformat()
    path.write_text(json.dumps(record("m1", "3024-01-01T10:00:00Z")) + "\n"
                    + json.dumps(record("m2", tomorrow)) + "\n"
                    + json.dumps(record("m3")) + "\n")
    episodes, rejects = read(path)
    assert episodes["source_id"].to_pylist() == ["m2", "m3"]
    assert rejects["reason"].to_pylist() == [
        "timestamp more than 2 days after the run's start (limits.future_days): "
        "3024-01-01T10:00:00+00:00"]
    episodes, rejects = read(path, LimitsConfig(future_days=0.5))
    assert episodes["source_id"].to_pylist() == ["m3"] and rejects.num_rows == 2
    assert build_output.reason_kind(rejects["reason"][0].as_py()) == (
        "timestamp more than 0.5 days after the run's start (limits.future_days)")


# --- tkg gc ----------------------------------------------------------------------------


def _snapshot(root: Path, run_id: str, mtime: int, runs: list[str] = ()) -> None:
    snap = store.snapshot_dir(root, run_id)
    (snap / "facts").mkdir(parents=True)
    (snap / "facts" / "part-0.parquet").write_bytes(b"x" * 1000)
    if runs:
        (snap / "runs").mkdir()
        pq.write_table(pa.Table.from_pylist([{"run_id": r, "status": "succeeded"}
                                             for r in runs], schema=schema.RUNS),
                       snap / "runs" / "part-0.parquet")
    store.write_manifest(snap, {"run_id": run_id})
    os.utime(snap / store.MANIFEST, (mtime, mtime))


def _work(root: Path, run_id: str, stages: tuple[str, ...] = (), previous: str = "") -> Path:
    work = root / "work" / run_id
    work.mkdir(parents=True)
    (work / "previous").write_text(previous)
    (work / reliability.RUN_LOG).write_text("log of " + run_id)
    for stage in stages:
        (work / stage).mkdir()
        (work / stage / "_SUCCESS.json").write_text('{"seconds": 1}')
    return work


def _store_for_gc(root: Path) -> None:
    for i, run in enumerate(["r1", "r2", "r3", "r4"]):
        _snapshot(root, run, 1_000 + i, runs=["r1", "r2", "r3", "r4"] if run == "r4" else [])
    store.switch_current(root, "r4")
    for run in ("r3", "r4"):
        _work(root, run, ("read", "window"))


def test_gc_keep_counts_snapshots_besides_current(tmp_path):
    for keep, kept in ((0, ["r4"]), (1, ["r3", "r4"]), (2, ["r2", "r3", "r4"])):
        root = tmp_path / f"keep{keep}"
        _store_for_gc(root)
        report = reliability.gc(root, keep=keep)
        assert sorted(report.kept) == kept, keep
        assert sorted(p.name for p in (root / "snapshots").iterdir()) == kept


def test_gc_work_dirs_logs_failed_starts_and_running_builds(tmp_path, capsys):
    """A kept snapshot's run keeps its log and nothing else; a dropped one's work dir goes;
    a failed start (no stage finished, its log not held) goes and no longer pins the
    snapshot it would have built on; a failed run with finished stages stays to resume; a
    build running now (its log held as `tkg build` holds it) is left alone."""
    root = tmp_path / "store"
    _store_for_gc(root)
    _work(root, "failed-start", previous="r1")
    _work(root, "resumable", ("read",), previous="r2")
    running = _work(root, "running", previous="r1")
    with open(running / reliability.RUN_LOG, "a") as held:
        reliability.hold_run_log(held)
        assert main(["gc", "--store", str(root), "--keep", "0", "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
    assert sorted(report["kept"]) == ["r1", "r2", "r4"]  # CURRENT; r1, r2 for running, resumable
    assert sorted(report["removed_work"]) == ["failed-start", "r3", "r4"]
    assert report["resumable"] == ["resumable"]
    assert sorted(p.name for p in (root / "work").iterdir()) == ["r4", "resumable", "running"]
    assert [p.name for p in (root / "work" / "r4").iterdir()] == [reliability.RUN_LOG]
    assert (root / "work" / "running" / "previous").is_file()
    # the held log released (the build ended without a stage): a failed start now
    assert reliability.gc(root, keep=0).removed_work == ["running"]
    assert sorted(reliability.gc(root, keep=0).kept) == ["r2", "r4"]


# --- query commands ---------------------------------------------------------------------


def _corpus_store(corpus_build) -> Path:
    return corpus_build.snapshot.parent.parent


def test_a_closed_pipe_ends_quietly(corpus_build):
    """`tkg context ... | head` where the reader is gone before anything is written."""
    run = subprocess.Popen([*TKG, "context", "--store", str(_corpus_store(corpus_build)),
                            "--group", "acme", "--query", "Where does Alice Chen work?"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
    run.stdout.close()
    err = run.stderr.read().decode()
    assert run.wait(timeout=300) == 141, err
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def test_search_shows_fact_dates_and_episode_speakers(corpus_build, capsys):
    args = ["search", "--store", str(_corpus_store(corpus_build)), "--group", "acme",
            "--query", "Where does Daniel Okafor live?"]
    assert main(args) == 0
    text = capsys.readouterr().out
    facts = text[text.index("facts:"):text.index("entities:")].splitlines()[1:]
    assert facts and all(re.search(r"  \[(\d{4}-\d\d-\d\d|\?) \.\. (\d{4}-\d\d-\d\d|now)\]$",
                                   line) for line in facts), facts
    assert "Paris" in text and "[2024-06-01 .. now]" in text
    assert main([*args, "--as-of", "2024-03-01"]) == 0  # Berlin, and when it ended
    berlin = [line for line in capsys.readouterr().out.splitlines() if "Berlin" in line]
    assert berlin and berlin[0].endswith(" .. 2024-06-01]"), berlin
    episodes = text[text.index("episodes:"):].splitlines()[1:]
    assert any(re.search(r"\[\d{4}-\d\d-\d\d, [A-Z][a-z]+ [A-Z][a-z]+\]$", e) for e in episodes)
    assert main([*args, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)["episodes"]
    assert found and all("speaker" in e for e in found)
    assert {e["speaker"] for e in found if e["source_id"].startswith("acme-conv")} - {None}


# --- keys, HTTP and MCP -----------------------------------------------------------------


def test_keys_add_quietly_list_and_revoke(tmp_path, capsys):
    keys_file = tmp_path / "keys.json"
    assert main(["keys", "add", "--keys", str(keys_file), "--name", "bot",
                 "--group", "acme"]) == 0
    out, err = capsys.readouterr()
    key = out.strip()
    assert out == key + "\n" and key.startswith(api_keys.PREFIX) and "bot" in err
    other = api_keys.add(keys_file, "home", ["household", "acme"])
    ring = api_keys.KeyFile(keys_file)
    assert api_keys.lookup(ring, key).name == "bot"
    assert main(["keys", "list", "--keys", str(keys_file), "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [(k["name"], k["groups"]) for k in listed] == [
        ("bot", ["acme"]), ("home", ["acme", "household"])]
    assert key not in json.dumps(listed) and other not in json.dumps(listed)
    assert main(["keys", "list", "--keys", str(keys_file)]) == 0
    assert "home" in capsys.readouterr().out
    assert main(["keys", "revoke", "--keys", str(keys_file), "--id", listed[0]["id"]]) == 0
    assert "revoked 1 key" in capsys.readouterr().out
    assert api_keys.lookup(ring, key) is None  # the file is read again: no restart
    assert api_keys.lookup(ring, other).name == "home"
    assert main(["keys", "revoke", "--keys", str(keys_file), "--name", "nobody"]) == 2
    assert "no single key named 'nobody'" in capsys.readouterr().err


@pytest.fixture(scope="module")
def served(corpus_build, tmp_path_factory):
    from fastapi.testclient import TestClient
    from tkg.pipeline.config import ServeConfig
    from tkg.query.serve import create_app

    from tests.test_serve import publish_copy_from

    root = tmp_path_factory.mktemp("operator-serve")
    store_dir = root / "store"
    (store_dir / "snapshots").mkdir(parents=True)
    publish_copy_from(corpus_build.snapshot.parent.parent, corpus_build.snapshot.name,
                      store_dir, "s1")
    keys_file = root / "keys.json"
    keys = {"acme": api_keys.add(keys_file, "acme-app", ["acme"]),
            "doomed": api_keys.add(keys_file, "doomed", ["acme"])}
    app = create_app(store_dir, keys_file, ServeConfig(), watch=False)
    with TestClient(app) as client:
        yield {"client": client, "keys": keys, "keys_file": keys_file, "app": app}


def test_post_search_defaults_to_the_keys_groups_and_history_gives_callers_ids(
        served, corpus_db):
    client, key = served["client"], served["keys"]["acme"]
    auth = {"Authorization": f"Bearer {key}"}
    question = {"query": "Where does Daniel Okafor live?"}
    implicit = client.post("/search", json=question, headers=auth)
    explicit = client.post("/search", json={**question, "group_ids": ["acme"]}, headers=auth)
    assert implicit.status_code == 200, implicit.text
    assert implicit.json() == explicit.json() and implicit.json()["facts"]
    assert client.post("/context", json=question, headers=auth).status_code == 200
    fact = implicit.json()["facts"][0]
    history = client.get(f"/facts/{fact['edge_id']}/history", headers=auth)
    assert history.status_code == 200, history.text
    versions = history.json()["versions"]
    internal = {e for (ids,) in corpus_db.execute(
        "SELECT episode_ids FROM facts WHERE edge_id = ?", [fact["edge_id"]]).fetchall()
        for e in ids}
    cited = {e for v in versions for e in v["episodes"]}
    assert set(fact["episodes"]) <= cited and not cited & internal
    assert cited == {s for (s,) in corpus_db.execute(
        "SELECT source_id FROM episodes WHERE list_contains(?, episode_id)",
        [list(internal)]).fetchall()}
    assert all("episode_ids" not in v for v in versions)


def test_a_revoked_key_is_refused_by_a_running_server(served):
    client, key = served["client"], served["keys"]["doomed"]
    ask = {"json": {"query": "Alice"}, "headers": {"X-API-Key": key}}
    assert client.post("/search", **ask).status_code == 200
    api_keys.revoke(served["keys_file"], name="doomed")
    assert client.post("/search", **ask).status_code == 401
    assert client.post("/search", json={"query": "Alice"}, headers={
        "X-API-Key": served["keys"]["acme"]}).status_code == 200


def test_docs_examples_name_no_fixed_port(served):
    description = served["client"].get("/openapi.json").json()["info"]["description"]
    assert "$TKG_URL/search" in description
    assert not re.search(r"(localhost|127\.0\.0\.1):\d+", description)


def test_mcp_says_a_wrong_key_is_wrong(corpus_build, tmp_path):
    keys_file = tmp_path / "keys.json"
    api_keys.add(keys_file, "agent", ["acme"])
    env = {**os.environ, "TKG_API_KEY": "tkg_not-a-key-of-this-file"}
    done = subprocess.run([*TKG, "mcp", "--store", str(_corpus_store(corpus_build)), "--keys",
                           str(keys_file)], env=env, stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert "the key in $TKG_API_KEY is not one of" in done.stderr
    assert "needs the key" not in done.stderr and "Traceback" not in done.stderr


def test_mcp_tools_take_the_http_parameters(corpus_build, corpus_db):
    """search_memory: conversation_id and recipe; get_context: known_at (before the first
    run: nothing known); the tools' schemas list them."""
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    created = store.read_manifest(corpus_build.snapshot)["created_at"]
    conversation = corpus_db.execute(
        "SELECT conversation_id FROM episodes WHERE group_id = 'acme' AND conversation_id "
        "IS NOT NULL ORDER BY valid_at DESC LIMIT 1").fetchone()[0]
    server = StdioServerParameters(command=TKG[0], args=[
        *TKG[1:], "mcp", "--store", str(_corpus_store(corpus_build)), "--group", "acme"])

    async def session() -> list[Any]:
        async with Client(server) as client:
            tools = {t.name: t.input_schema["properties"] for t in
                     (await client.list_tools()).tools}
            return [tools] + [await client.call_tool(name, args) for name, args in (
                ("search_memory", {"query": "Where does Daniel Okafor live?",
                                   "recipe": "facts_hybrid_mmr", "limit": 3}),
                ("search_memory", {"query": "who", "conversation_id": conversation}),
                ("search_memory", {"query": "who", "recipe": "no-such-recipe"}),
                ("get_context", {"query": "Where does Daniel Okafor live?",
                                 "known_at": "2020-01-01T00:00:00Z"}),
                ("get_context", {"query": "Where does Daniel Okafor live?",
                                 "known_at": created}))]

    tools, by_recipe, by_conversation, unknown, before, after = asyncio.run(session())
    assert {"conversation_id", "recipe"} <= set(tools["search_memory"])
    assert {"known_at", "conversation_id", "recipe"} <= set(tools["get_context"])
    assert not by_recipe.is_error and by_recipe.structured_content["facts"]
    assert not by_recipe.structured_content["entities"]  # a facts-only recipe
    assert not by_conversation.is_error and by_conversation.structured_content["entities"]
    assert unknown.is_error and "unknown recipe" in unknown.content[0].text
    assert "Daniel Okafor" not in before.content[0].text
    assert "Daniel Okafor" in after.content[0].text


@dataclass
class Opened:
    run_id: str


def test_a_snapshot_switch_is_logged(tmp_path, caplog):
    from tkg.jobs.bench.query import synth_tables, write_store
    from tkg.pipeline.config import QueryConfig
    from tkg.query.snapshot import SnapshotHolder

    tables, _ = synth_tables(200, 32, 2, seed=5)
    write_store(tmp_path, tables, 32, QueryConfig(), seed=5, run_id="s1")
    with caplog.at_level(logging.INFO, logger="tkg.snapshot"):
        holder = SnapshotHolder(tmp_path, lambda path: Opened(store.read_manifest(path)["run_id"]))
        write_store(tmp_path, tables, 32, QueryConfig(), seed=5, run_id="s2")
        assert holder.refresh()
    lines = [r.getMessage() for r in caplog.records if r.name == "tkg.snapshot"]
    assert lines == [f"serving snapshot s1 of {tmp_path}",
                     f"switched to snapshot s2 (was s1) of {tmp_path}"]


# --- a checkout without an install; SQL --------------------------------------------------


def test_module_runs_from_a_checkout_without_the_install():
    """`ray job submit --working-dir . -- python -m tkg.jobs.backfill ...` where `python`
    has tkg's dependencies but not the venv's editable install: the checkout's `tkg/` (found
    first, the working dir) reaches its layers."""
    env = {**os.environ, "PYTHONPATH": sysconfig.get_paths()["purelib"]}
    done = subprocess.run([sys.executable, "-S", "-m", "tkg.jobs.backfill", "--help"],
                          env=env, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert "--input" in done.stdout
    where = subprocess.run([sys.executable, "-S", "-c", "import tkg.query.api as m; "
                            "print(m.__file__)"], env=env, capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
    assert where.stdout.strip() == str(ROOT / "query" / "api.py"), where.stderr


def test_entity_history_in_one_group(corpus_db):
    alias = corpus_db.execute("""
        SELECT a.alias FROM entity_aliases a
        JOIN facts f ON f.group_id = a.group_id AND f.source_entity_id = a.entity_id
        GROUP BY a.alias ORDER BY count(DISTINCT a.group_id) DESC, count(*) DESC, a.alias
        LIMIT 1""").fetchone()[0]
    everywhere = corpus_db.execute("SELECT group_id, edge_id, version FROM entity_history(?)",
                                   [alias]).fetchall()
    by_group = {}
    for group in ("acme", "household"):
        by_group[group] = corpus_db.execute(
            "SELECT group_id, edge_id, version FROM entity_history(?, ?)",
            [alias, group]).fetchall()
        assert {g for g, _, _ in by_group[group]} <= {group}
    assert sorted(by_group["acme"] + by_group["household"]) == sorted(everywhere)
    assert everywhere
