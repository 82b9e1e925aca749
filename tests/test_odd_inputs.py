"""Odd inputs are ordinary: an empty file, a file whose every record is rejected, a record that
yields no entities, a group of one episode, and an incremental run whose new records yield no
facts each build through `tkg build` with exit 0, the usual summary and a valid snapshot;
files of a type tkg does not read are refused before Ray starts.

The builds run in this process on the session's Ray (a subprocess costs a Ray start); the one
`--json` build runs as a subprocess, because what it must prove is what reaches stdout.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STAGES = 10  # the registry's stages; publish adds a line
SUMMARY_LINES = 40  # the counts table, the accepted line, snapshot and log paths


def _message(id_: str, content: str, group: str = "odd") -> str:
    return json.dumps({"group_id": group, "id": id_, "kind": "message",
                       "timestamp": "2024-03-01T10:00:00Z", "conversation_id": "c1",
                       "speaker": "Alice Chen", "content": content}) + "\n"


@pytest.fixture(scope="module")
def odd(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("odd")
    (folder / "empty.jsonl").write_text("")
    (folder / "rejected.jsonl").write_text("not json\n{\"group_id\": \n]]\n")
    (folder / "no_entities.jsonl").write_text(json.dumps({
        "group_id": "odd", "id": "t1", "kind": "text", "timestamp": "2024-03-01T10:00:00Z",
        "content": "ok thanks"}) + "\n")
    (folder / "one_fact.jsonl").write_text(
        _message("m1", "Daniel Okafor lives in Berlin.", group="solo"))
    (folder / "no_facts.jsonl").write_text(_message("m2", "ok", group="solo"))
    (folder / "config.yaml").write_text(
        "ray: {shuffle_partitions: 2, progress_bars: false}\n"
        "extract: {actors: 1}\nembed: {actors: 1, threads_per_actor: 2}\n")
    return folder


def _build(capfd, odd: Path, name: str, store: Path, *run_id: str) -> tuple[int, str, str]:
    from tkg.jobs.cli import main

    code = main(["build", "--config", str(odd / "config.yaml"), "--input", str(odd / name),
                 "--store", str(store), *(("--run-id", *run_id) if run_id else ())])
    out, err = capfd.readouterr()
    return code, out, err


def _tables(store: Path) -> dict[str, int]:
    from tkg.pipeline import store as stores

    with stores.connect(store) as con:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0]
                for t in ("episodes", "entities", "facts", "facts_current", "mentions",
                          "communities", "rejects")}


def _quiet(out: str, err: str) -> None:
    assert "Traceback" not in out + err and "INFO" not in out + err, out + err
    assert len(out.splitlines()) <= STAGES + 1 + SUMMARY_LINES, out
    assert "log: " in out


@pytest.mark.parametrize(("name", "accepted", "tables", "warning"), [
    ("empty.jsonl", "0 accepted, 0 rejected",
     {"episodes": 0, "entities": 0, "facts": 0, "rejects": 0}, "the input holds no record"),
    ("rejected.jsonl", "0 accepted, 3 rejected: malformed JSON (3)",
     {"episodes": 0, "entities": 0, "facts": 0, "rejects": 3}, "every record was rejected"),
])  # (the input with no entities is the --json build's, below: one build less)
def test_odd_input_builds_an_ordinary_snapshot(ray_session, odd, tmp_path, capfd, name,
                                               accepted, tables, warning):
    code, out, err = _build(capfd, odd, name, tmp_path / "store")
    assert code == 0, err
    assert accepted in out
    assert f"tkg build: warning: {warning}" in err
    _quiet(out, err)
    counts = _tables(tmp_path / "store")
    assert {k: counts[k] for k in tables} == tables


def test_incremental_run_with_no_new_facts(ray_session, odd, tmp_path, capfd):
    """The smallest input that sends an empty block into the versions shuffle: the store
    holds one fact (a group of one episode), the new run's only record yields none. The
    two runs again entirely on Ray Data and actor pools publish the same tables."""
    from tkg.pipeline import store as stores
    from tkg.pipeline.build import build
    from tkg.pipeline.config import load_config

    from tests.paths import differences, on_ray_data

    store = tmp_path / "store"
    code, out, err = _build(capfd, odd, "one_fact.jsonl", store, "run-1")
    assert code == 0, err
    first = _tables(store)
    assert first["episodes"] == 1 and first["facts"] == 1
    code, out, err = _build(capfd, odd, "no_facts.jsonl", store, "run-2")
    assert code == 0, err
    assert "1 accepted, 0 rejected" in out
    _quiet(out, err)
    second = _tables(store)
    assert second["episodes"] == 2
    assert second["facts"] == second["facts_current"] == 1  # kept, not versioned again

    on_ray = on_ray_data(load_config(odd / "config.yaml"))
    for run_id, name in (("run-1", "one_fact.jsonl"), ("run-2", "no_facts.jsonl")):
        night = build(on_ray, [str(odd / name)], tmp_path / "on-ray-data", run_id=run_id)
    assert differences(stores.current_snapshot(store), night.snapshot) == {}


def test_build_json_prints_exactly_one_object(odd, tmp_path):
    """Also the odd input whose one record yields no entities: an ordinary snapshot."""
    done = subprocess.run(
        [sys.executable, "-m", "tkg.jobs.cli", "build", "--config", str(odd / "config.yaml"),
         "--input", str(odd / "no_entities.jsonl"), "--store", str(tmp_path / "store"),
         "--json"],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)  # the whole of stdout, nothing before or after
    assert isinstance(summary, dict)
    assert (summary["episodes_in"], summary["episodes_ok"], summary["rejected"]) == (1, 1, 0)
    assert "Traceback" not in done.stderr
    assert _tables(tmp_path / "store") == {"episodes": 1, "entities": 0, "facts": 0,
                                           "facts_current": 0, "mentions": 0,
                                           "communities": 0, "rejects": 0}


def test_unsupported_inputs_are_refused_before_ray_starts(tmp_path):
    (tmp_path / "table.csv").write_text("id,content\n1,hello\n")
    (tmp_path / "table.tsv").write_text("id\tcontent\n1\thello\n")
    (tmp_path / "book.xlsx").write_bytes(b"PK\x03\x04 not really a workbook")
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "readme.txt").write_text("hello")
    names = ["table.csv", "table.tsv", "book.xlsx", "notes"]
    script = (
        "import json, sys\n"
        "from tkg.jobs.cli import main\n"
        "codes = [main(['build', '--input', n, '--store', 'store']) for n in sys.argv[1:]]\n"
        "import ray\n"
        "print(json.dumps({'codes': codes, 'ray': ray.is_initialized()}))\n")
    done = subprocess.run([sys.executable, "-c", script, *names], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path)
    result = json.loads(done.stdout.splitlines()[-1])
    assert result == {"codes": [2, 2, 2, 2], "ray": False}
    errors = done.stderr.splitlines()
    assert len(errors) == len(names), done.stderr
    for name, line in zip(names, errors, strict=True):
        assert name in line and ".jsonl" in line and ".parquet" in line, line



def test_a_failing_stage_prints_one_line_and_the_log(ray_session, odd, tmp_path, capfd,
                                                      monkeypatch):
    monkeypatch.setenv("TKG_FAULT", "stage_error:window")
    code, out, err = _build(capfd, odd, "empty.jsonl", tmp_path / "store")
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 2, err
    assert lines[0].startswith("tkg: error: stage window failed: InjectedError: ")
    assert "--run-id" not in lines[0]  # the same error on every attempt: resuming cannot help
    log = Path(lines[1].removeprefix("tkg: log: "))
    assert "Traceback" in log.read_text() and "Traceback" not in out + err


def test_json_stdout_stays_the_objects_after_the_block():
    """What the driver prints after the build (Ray's raylet warnings come from a thread of
    its own, on sys.stdout, until Ray shuts down at exit) goes to stderr under --json."""
    script = (
        "import os, threading\n"
        "from tkg.jobs import build_output\n"
        "with build_output.terminal(None, True) as (out, err):\n"
        "    print('inside the block')\n"
        "    print('{\"episodes\": 0}', file=out)\n"
        "late = threading.Thread(target=lambda: print('(raylet) 9 PYTHON worker processes'))\n"
        "late.start()\n"
        "late.join()\n"
        "os.write(1, b'fd 1 after the block\\n')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"episodes": 0}\n'
    for line in ("inside the block", "PYTHON worker processes", "fd 1 after the block"):
        assert line in done.stderr
