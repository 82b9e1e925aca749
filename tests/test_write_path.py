"""Agents add memory the batch way (pipeline/inbox.py): the Python API, `POST /episodes` on a
real `tkg serve` and the MCP tool `add_memory` (the SDK's client over stdio) each append
episodes, checked by the input contract, to the store's inbox; a key writes only its groups;
a server killed right after accepting loses nothing; `tkg build --inbox` builds each
episode exactly once and leaves the inbox empty."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from mcp import Client
from mcp.client.stdio import StdioServerParameters
from tkg.jobs.inbox import BuildEvery
from tkg.pipeline import inbox, schema, storage, store
from tkg.query import keys as api_keys

TKG = [sys.executable, "-m", "tkg.jobs.cli"]


def message(group: str | None, source_id: str, content: str, day: int = 1) -> dict[str, Any]:
    record = {"id": source_id, "kind": "message", "conversation_id": "c1",
              "speaker": "Alice Walker", "timestamp": f"2026-03-{day:02d}T10:00:00Z",
              "content": content}
    return record if group is None else {"group_id": group, **record}


@pytest.fixture(scope="module")
def written(ray_session, config, tmp_path_factory) -> dict[str, Any]:
    """A small store with a snapshot (a server needs one), its config and two keys."""
    from tkg.jobs.cli import main

    folder = tmp_path_factory.mktemp("write")
    config_file = folder / "config.yaml"
    config_file.write_text(yaml.safe_dump(config.model_dump(mode="json")))
    first = folder / "first.jsonl"
    first.write_text(json.dumps(message("w1", "seed", "I work at Globex in Lisbon.")) + "\n")
    code = main(["build", "--config", str(config_file), "--input", str(first), "--store",
                 str(folder / "store"), "--json"])
    assert code == 0
    keys_file = folder / "keys.json"
    keys = {"w1": api_keys.add(keys_file, "agent-w1", ["w1"]),
            "w2": api_keys.add(keys_file, "agent-w2", ["w2"])}
    return {"store": folder / "store", "config": config_file, "keys_file": keys_file,
            "keys": keys}


def waiting_ids(store_dir: Path) -> list[str]:
    """The episode ids of every record waiting in the inbox."""
    ids = []
    for part in inbox.waiting(store_dir):
        for line in Path(part).read_text().splitlines():
            record = json.loads(line)
            ids.append(schema.stable_id(record["group_id"], record["id"]))
    return ids


def build_inbox(written: dict[str, Any]) -> int:
    from tkg.jobs.cli import main

    return main(["build", "--inbox", "--config", str(written["config"]), "--store",
                 str(written["store"]), "--json"])


def built_counts(store_dir: Path) -> dict[str, int]:
    """episode_id -> rows in the current snapshot's episodes."""
    with store.open_catalog(store.current_snapshot(store_dir)) as con:
        rows = con.execute("SELECT episode_id, count(*) FROM episodes GROUP BY 1").fetchall()
    return {episode: count for episode, count in rows}


def build_and_check_once(written: dict[str, Any], build: Any = build_inbox) -> set[str]:
    """Build the inbox: every episode that waited is in the snapshot exactly once, and
    nothing waits after."""
    expected = set(waiting_ids(written["store"]))
    assert expected
    assert build(written) == 0
    counts = built_counts(written["store"])
    assert {e: counts.get(e, 0) for e in expected} == dict.fromkeys(expected, 1)
    assert inbox.waiting(written["store"]) == []
    return expected


def test_python_api_adds_and_the_next_build_holds_each_episode_once(written):
    from tkg.query import add_episodes, open

    added = add_episodes(written["store"], [
        message("w1", "p1", "Maria Lopez leads the data team at Globex.", 2),
        message("w1", "p2", "Bob Stone moved to Porto.", 3),
        message("w1", "p3", "A typo of a year.", 1) | {"timestamp": "3024-03-01T10:00:00Z"},
        {"group_id": "w1", "kind": "message", "content": "no id"},
    ])
    assert added.accepted == 2 and added.rejected == 2
    ok, later, typo, no_id = added.results
    assert ok["episode_id"] == schema.stable_id("w1", "p1") and later["id"] == "p2"
    assert "limits.future_days" in typo["reason"] and "'id'" in no_id["reason"]
    # a re-delivery through a retriever: a second part, the same episode
    again = open(written["store"]).add_episodes([
        message("w1", "p1", "Maria Lopez leads the data team at Globex.", 2)])
    assert again.results[0]["episode_id"] == ok["episode_id"]
    assert len(inbox.waiting(written["store"])) == 2

    built = build_and_check_once(written)
    assert built == {ok["episode_id"], later["episode_id"]}
    done = list((written["store"] / "inbox" / "done").iterdir())
    assert len(done) == 1 and len(list(done[0].iterdir())) == 2
    # nothing waits: nothing is built, the snapshot stays
    current = store.current_run(written["store"])
    assert build_inbox(written) == 0 and store.current_run(written["store"]) == current


def test_mcp_add_memory_writes_only_the_keys_group(written):
    params = StdioServerParameters(
        command=TKG[0], args=[*TKG[1:], "mcp", "--store", str(written["store"]), "--keys",
                              str(written["keys_file"])],
        env={"TKG_API_KEY": written["keys"]["w1"]})

    async def session() -> list[Any]:
        async with Client(params) as client:
            return [await client.call_tool("add_memory", {
                        "content": "Alice Walker adopted a cat named Miso.",
                        "speaker": "Alice Walker", "conversation_id": "c9", "id": "mcp-1",
                        "timestamp": "2026-03-05T10:00:00Z"}),
                    await client.call_tool("add_memory", {"content": "Remember the blue car."}),
                    await client.call_tool("add_memory", {"content": "not mine",
                                                          "group_id": "w2"}),
                    await client.call_tool("add_memory", {"content": "too late",
                                                          "timestamp": "3024-01-01"})]

    named, text, other, future = asyncio.run(session())
    assert not named.is_error, named.content
    assert named.structured_content["episode_id"] == schema.stable_id("w1", "mcp-1")
    assert not text.is_error and text.structured_content["group_id"] == "w1"
    assert other.is_error and "w2" in other.content[0].text
    assert future.is_error and "limits.future_days" in future.content[0].text
    waiting = set(waiting_ids(written["store"]))
    assert {named.structured_content["episode_id"],
            text.structured_content["episode_id"]} <= waiting
    assert not any(group == "w2" for group in _waiting_groups(written["store"]))


def _waiting_groups(store_dir: Path) -> list[str]:
    return [json.loads(line)["group_id"] for part in inbox.waiting(store_dir)
            for line in Path(part).read_text().splitlines()]


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_http_writes_only_the_keys_groups_and_a_killed_server_loses_nothing(written):
    import httpx

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [*TKG, "serve", "--store", str(written["store"]), "--keys", str(written["keys_file"]),
         "--port", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    w1 = {"Authorization": f"Bearer {written['keys']['w1']}"}
    try:
        deadline = time.monotonic() + 300
        while True:
            try:
                httpx.get(f"{url}/healthz", timeout=5)
                break
            except httpx.TransportError:
                assert server.poll() is None and time.monotonic() < deadline, (
                    server.stderr.read().decode() if server.poll() is not None else "slow")
                time.sleep(0.3)
        parts = len(inbox.waiting(written["store"]))
        accepted = httpx.post(f"{url}/episodes", headers=w1, timeout=60, json={"episodes": [
            message("w1", "h1", "Maria Lopez joined Initech.", 6),
            message(None, "h2", "Bob Stone sold his bike.", 7),  # the key's one group
            message("w1", "h3", "bad", 8) | {"kind": "poem"}]})
        assert accepted.status_code == 200, accepted.text
        body = accepted.json()
        assert body["accepted"] == 2 and body["rejected"] == 1
        first, second, bad = body["results"]
        assert first["episode_id"] == schema.stable_id("w1", "h1")
        assert second["episode_id"] == schema.stable_id("w1", "h2")
        assert "poem" in bad["reason"]
        refused = httpx.post(f"{url}/episodes", headers=w1, timeout=60, json={"episodes": [
            message("w1", "h4", "mine", 9), message("w2", "h5", "not mine", 9)]})
        assert refused.status_code == 403 and "w2" in refused.text
        nothing = httpx.post(f"{url}/episodes", headers=w1, timeout=60,
                             json={"episodes": [{"group_id": "w1"}]})
        assert nothing.status_code == 422 and nothing.json()["accepted"] == 0
        anonymous = httpx.post(f"{url}/episodes", timeout=60,
                               json={"episodes": [message("w1", "h6", "who?", 9)]})
        assert anonymous.status_code == 401
        assert len(inbox.waiting(written["store"])) == parts + 1
    finally:
        os.kill(server.pid, signal.SIGKILL)  # right after the answers: no shutdown of any kind
        server.wait(30)
    # built the way `tkg serve --build-every N` does: `tkg build --inbox` in a process
    every = BuildEvery(str(written["store"]), 1, str(written["config"]))
    built = build_and_check_once(written, lambda _: every.once())
    assert {first["episode_id"], second["episode_id"]} <= built
    assert schema.stable_id("w1", "h4") not in built_counts(written["store"])
    assert every.once() is None  # nothing waits: no build


def test_the_inbox_on_object_storage(s3, s3_config):
    """The same inbox under an `s3://` store (a real S3-compatible server): a part is one
    upload, listed while it waits, claimed by a run and moved to `done/<run>/` after it."""
    from tkg.query import add_episodes

    config = s3_config.storage
    store_url = s3.url()
    storage.configure(config)
    try:
        added = add_episodes(store_url, [message("w1", "s1", "Alice moved to Porto.", 4),
                                         {"group_id": "w1", "id": "s2"}])
        assert added.accepted == 1 and "timestamp" in added.results[1]["reason"]
        parts = inbox.waiting(store_url, config)
        assert len(parts) == 1 and parts[0].startswith(f"{store_url}/inbox/waiting/")
        line = json.loads(storage.read_text(parts[0], config))
        assert line["id"] == "s1"
        work = store.work_dir(store_url, "run-1")
        assert inbox.claim(store_url, work, config) == parts
        add_episodes(store_url, [message("w1", "s3", "later", 5)])  # arrives after the claim
        assert inbox.claim(store_url, work, config) == parts  # a resume reads the same
        assert inbox.mark_ingested(store_url, parts, "run-1", config) == 1
        left = inbox.waiting(store_url, config)
        assert len(left) == 1 and left != parts
        assert storage.exists(f"{store_url}/inbox/done/run-1/{storage.name(parts[0])}", config)
    finally:
        storage.configure(None)


def test_build_needs_an_input_or_the_inbox(tmp_path, capsys):
    from tkg.jobs.cli import main

    assert main(["build", "--store", str(tmp_path / "store")]) == 2
    assert "--inbox" in capsys.readouterr().err
