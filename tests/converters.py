"""Turn the public datasets in ../shared/data into tkg's input contract (tests only)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

# Django foreign keys (each holds the pk of another record) -> `<field>_id`, the key field
# form records are mapped by (pipeline/extract/records.py).
CHINOOK_REFERENCES = {"customer", "artist", "album", "support_rep", "reports_to", "genre",
                      "mediatype", "invoice", "track", "playlist"}
CHINOOK_DATES = ("invoicedate", "hiredate")


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


def chinook_to_episodes(path: Path, models: tuple[str, ...], group_id: str = "chinook"
                        ) -> list[dict]:
    """Chinook fixture rows of the given models -> JSON business records."""
    records = []
    for item in json.loads(path.read_text()):
        model = item["model"].split(".")[-1]
        if model not in models:
            continue
        data = {f"{model}_id": item["pk"]}
        for key, value in item["fields"].items():
            data[f"{key}_id" if key in CHINOOK_REFERENCES and value is not None else key] = value
        when = next((item["fields"][k] for k in CHINOOK_DATES if item["fields"].get(k)),
                    "2007-01-01T00:00:00Z")
        records.append({
            "group_id": group_id, "id": f"{model}-{item['pk']}", "kind": "json",
            "timestamp": when, "source": f"chinook.{model}s", "data": data,
        })
    return records


def write_jsonl(records: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path
