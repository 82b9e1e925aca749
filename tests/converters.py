"""Turn the public datasets in ../shared/data into tkg's input contract (tests only)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

from tkg.jobs.bench import chinook

chinook_to_episodes = chinook.to_episodes  # one converter: the records test and the bench's


def dmr_to_episodes(path: Path, group_id: str = "dmr") -> list[dict]:
    """One DMR row -> its sessions as conversations (previous dialogs, then the last one),
    one day apart, messages a minute apart, in order. Earlier sessions carry no speaker ids:
    turns alternate between "Speaker 1" and "Speaker 2" as in the last session."""
    records = []
    start = datetime(2023, 1, 1, tzinfo=UTC)
    for row_number, line in enumerate(path.read_text().splitlines()):
        row = json.loads(line)
        sessions = [s["dialog"] for s in row["previous_dialogs"]] + [row["dialog"]]
        for session_number, dialog in enumerate(sessions):
            moment = start + timedelta(days=30 * row_number + session_number)
            conversation = f"dmr-{row_number}-s{session_number}"
            for turn, message in enumerate(dialog):
                records.append({
                    "group_id": group_id, "id": f"{conversation}-m{turn}", "kind": "message",
                    "timestamp": (moment + timedelta(minutes=turn)).isoformat(),
                    "conversation_id": conversation,
                    "speaker": message.get("id") or f"Speaker {turn % 2 + 1}",
                    "content": message["text"],
                })
    return records


def write_jsonl(records: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
