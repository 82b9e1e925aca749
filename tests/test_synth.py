"""Tests for the synthetic episode generator (jobs/bench/synth.py)."""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from datetime import datetime
from itertools import pairwise
from pathlib import Path

import pytest
from tkg.jobs.bench.synth import generate_episodes, write_jsonl

N = 6000
GROUP_RE = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
REQUIRED = {
    "message": {
        "group_id",
        "id",
        "kind",
        "timestamp",
        "conversation_id",
        "speaker",
        "role",
        "content",
    },
    "json": {"group_id", "id", "kind", "timestamp", "source", "data"},
    "text": {"group_id", "id", "kind", "timestamp", "title", "content"},
}
SOURCES = {"crm.customers", "crm.contacts", "sales.orders", "support.tickets"}


@pytest.fixture(scope="module")
def records() -> list[dict]:
    """One mid-sized batch shared by the tests."""
    return generate_episodes(N, seed=7, groups=3)


@pytest.mark.parametrize("n,groups", [(0, 3), (1, 3), (2, 5), (17, 1), (999, 4)])
def test_exact_count(n: int, groups: int) -> None:
    assert len(generate_episodes(n, seed=1, groups=groups)) == n


def test_contacts_change_jobs_and_cities_over_the_timeline(records: list[dict]) -> None:
    """The world evolves (employer, city, title), so a contact's later records contradict its
    earlier ones, as the facts a build must invalidate do; between changes the state holds."""
    history: dict[tuple[str, str], list[tuple[str, ...]]] = defaultdict(list)
    for r in records:
        if r["kind"] == "json" and r["source"] == "crm.contacts":
            d = r["data"]
            history[(r["group_id"], d["contact_id"])].append(
                (r["timestamp"], d["company"], d["city"], d["title"]))
    steps = [a[1:] != b[1:] for states in history.values() for a, b in pairwise(sorted(states))]
    changed = [key for key, states in history.items() if len({s[1:] for s in states}) > 1]
    assert len(changed) >= len(history) // 4
    assert 0 < sum(steps) < len(steps)  # states change, and hold between changes


def test_deterministic(records: list[dict]) -> None:
    again = generate_episodes(N, seed=7, groups=3)
    assert json.dumps(again, sort_keys=True) == json.dumps(records, sort_keys=True)
    other = generate_episodes(N, seed=8, groups=3)
    assert json.dumps(other, sort_keys=True) != json.dumps(records, sort_keys=True)


def test_kind_proportions(records: list[dict]) -> None:
    kinds = Counter(r["kind"] for r in records)
    assert set(kinds) == {"message", "json", "text"}
    assert 0.65 <= kinds["message"] / N <= 0.75
    assert 0.15 <= kinds["json"] / N <= 0.25
    assert 0.07 <= kinds["text"] / N <= 0.13


def test_groups_and_unique_ids(records: list[dict]) -> None:
    ids: dict[str, set[str]] = defaultdict(set)
    for r in records:
        assert GROUP_RE.match(r["group_id"])
        assert r["id"] not in ids[r["group_id"]]
        ids[r["group_id"]].add(r["id"])
    assert set(ids) == {"tenant-0", "tenant-1", "tenant-2"}


def test_timestamps_parse(records: list[dict]) -> None:
    for r in records:
        assert r["timestamp"].endswith("Z")
        ts = datetime.fromisoformat(r["timestamp"])
        assert ts.utcoffset() is not None and ts.utcoffset().total_seconds() == 0
        assert 2023 <= ts.year <= 2025


def test_json_serializable(records: list[dict], tmp_path: Path) -> None:
    for r in records:
        assert json.loads(json.dumps(r)) == r
    path = write_jsonl(records, tmp_path / "sub" / "episodes.jsonl")
    lines = path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == N
    assert json.loads(lines[0]) == records[0]
    assert json.loads(lines[-1]) == records[-1]


def test_required_fields(records: list[dict]) -> None:
    for r in records:
        missing = REQUIRED[r["kind"]] - set(r)
        assert not missing, (missing, r)
        for key in REQUIRED[r["kind"]] - {"data"}:
            assert isinstance(r[key], str) and r[key], (key, r)
        if "source_description" in r:
            assert isinstance(r["source_description"], str)
        if r["kind"] == "message":
            assert r["role"] in {"user", "assistant"}
            assert len(r["speaker"].split()) >= 2
            assert 5 <= len(r["content"].split()) <= 40, r["content"]
        elif r["kind"] == "json":
            assert r["source"] in SOURCES
            assert isinstance(r["data"], dict) and r["data"]
        else:
            sentences = r["content"].count(".") + r["content"].count("?")
            assert 2 <= sentences <= 8, r["content"]
    assert any("source_description" in r for r in records)
    assert not all("source_description" in r for r in records)


def test_json_records_reference_ids(records: list[dict]) -> None:
    by_source: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if r["kind"] == "json":
            by_source[r["source"]].append(r["data"])
    assert set(by_source) == SOURCES
    assert all("customer_id" in d and "name" in d for d in by_source["crm.customers"])
    assert all("order_id" in d and "company" in d for d in by_source["sales.orders"])
    assert all("ticket_id" in d and "assignee" in d for d in by_source["support.tickets"])
    assert any("line_items" in d for d in by_source["sales.orders"])


def test_conversations(records: list[dict]) -> None:
    convs: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        if r["kind"] == "message":
            convs[r["conversation_id"]].append(r)
    assert len(convs) > 50
    sizes = sorted(len(v) for v in convs.values())
    assert sizes[-1] <= 30
    assert sum(s >= 5 for s in sizes) >= len(sizes) - 3  # only each group's last may be short
    for msgs in convs.values():
        assert len({m["group_id"] for m in msgs}) == 1
        assert 1 <= len({m["speaker"] for m in msgs}) <= 3
        times = [datetime.fromisoformat(m["timestamp"]) for m in msgs]
        for a, b in pairwise(times):
            assert 60 <= (b - a).total_seconds() <= 300


def test_names_recur_within_group(records: list[dict]) -> None:
    speakers: dict[str, Counter[str]] = defaultdict(Counter)
    for r in records:
        if r["kind"] == "message":
            speakers[r["group_id"]][r["speaker"]] += 1
    for counts in speakers.values():
        assert 10 <= len(counts) <= 80
        assert counts.most_common(1)[0][1] >= 20
    companies = {
        r["data"]["company"]
        for r in records
        if r["kind"] == "json" and "company" in r["data"] and r["group_id"] == "tenant-0"
    }
    assert 5 <= len(companies) <= 40


def test_customer_ids_are_stable(records: list[dict]) -> None:
    names: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in records:
        data = r.get("data", {})
        if "customer_id" in data:
            names[(r["group_id"], data["customer_id"])].add(data.get("company") or data["name"])
    assert names
    assert all(len(v) == 1 for v in names.values())
