"""`tkg eval`: retrieval quality on labelled questions, for a recipe and the flat baseline.

A question file is JSON Lines, one question a line:
    {"group_id": "acme", "question": "...", "evidence": ["<source_id>", ...],
     "category": "temporal", "as_of": "2024-07-01", "answer": "optional answer text"}
A line may instead point at a row of a public data set, so its text is never copied:
    {"dataset": "dmr", "path": "../shared/data/dmr_msc_sample.jsonl", "row": 0,
     "group_id": "dmr", "evidence": ["dmr-0-s0-m12"], "category": "dmr"}
(`path` is relative to the question file; question and answer come from the row's
`self_instruct` B and A.) Metrics over the first k entries of the result's `episodes` list:
hit@k (any evidence episode there) and evidence recall@k (the share of evidence episodes
there); with an answer, whether all its content words appear in the context string.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tkg.query.context import build_context
from tkg.query.recipes import BASELINE

STOPWORDS = frozenset((
    "a", "an", "and", "are", "at", "be", "did", "do", "for", "i", "in", "is", "it", "my", "of",
    "on", "or", "that", "the", "to", "was", "we", "what", "where", "which", "who", "with",
    "you", "your"))


@dataclass(frozen=True)
class Question:
    group_id: str
    question: str
    evidence: tuple[str, ...]
    category: str = "all"
    as_of: str | None = None
    known_at: str | None = None
    answer: str | None = None


def _dataset_row(line: dict[str, Any], base: Path) -> dict[str, Any]:
    path = Path(line["path"])
    path = path if path.is_absolute() else (base / path)
    if not path.is_file():
        raise FileNotFoundError(f"question data set {path} not found (these questions read "
                                "public data from ../shared/data; skip them where it is absent)")
    rows = path.read_text().splitlines()
    row = json.loads(rows[int(line["row"])])
    if line.get("dataset") != "dmr":
        raise ValueError(f"unknown question data set {line.get('dataset')!r}; known: dmr")
    return {"question": row["self_instruct"]["B"], "answer": row["self_instruct"]["A"]}


def load_questions(path: str | Path) -> list[Question]:
    """Read a question file; a bad line is an error that names the line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"question file {path} not found")
    questions = []
    for number, text in enumerate(path.read_text().splitlines(), start=1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
            if "dataset" in line:
                line = {**line, **_dataset_row(line, path.parent)}
            questions.append(Question(
                group_id=line["group_id"], question=line["question"],
                evidence=tuple(line["evidence"]), category=line.get("category", "all"),
                as_of=line.get("as_of"), known_at=line.get("known_at"),
                answer=line.get("answer")))
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            if isinstance(exc, FileNotFoundError):
                raise
            raise ValueError(f"{path}:{number}: not a question line ({exc}); expected "
                             '{"group_id", "question", "evidence": [...]}') from exc
    return questions


def answer_words(answer: str) -> list[str]:
    words = re.findall(r"[a-z0-9]+", answer.lower())
    return [w for w in words if w not in STOPWORDS]


def score_question(retriever: Any, q: Question, recipe: str, k: int,
                   context_tokens: int) -> dict[str, Any]:
    result = retriever.search(q.question, [q.group_id], recipe=recipe, limit=k,
                              as_of=q.as_of, known_at=q.known_at)
    cited = [e.source_id for e in result.episodes[:k]]
    found = [e for e in q.evidence if e in cited]
    row: dict[str, Any] = {
        "question": q.question, "category": q.category, "group_id": q.group_id,
        "hit": bool(found), "recall": len(found) / len(q.evidence) if q.evidence else 0.0,
        "missing": [e for e in q.evidence if e not in cited],
    }
    if q.answer:
        context = build_context(result, context_tokens).lower()
        words = answer_words(q.answer)
        row["answer_in_context"] = all(re.search(rf"\b{re.escape(w)}\b", context)
                                       for w in words)
    return row


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    def figures(subset: list[dict[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {
            "questions": len(subset),
            "hit": round(sum(r["hit"] for r in subset) / len(subset), 4),
            "recall": round(sum(r["recall"] for r in subset) / len(subset), 4),
        }
        answered = [r for r in subset if "answer_in_context" in r]
        if answered:
            out["answer_in_context"] = sum(r["answer_in_context"] for r in answered)
        return out

    categories = sorted({r["category"] for r in rows})
    return {"overall": figures(rows) if rows else {},
            "categories": {c: figures([r for r in rows if r["category"] == c])
                           for c in categories}}


def evaluate(retriever: Any, questions: list[Question], recipe: str, k: int = 10,
             context_tokens: int = 2_000, baseline: str = BASELINE) -> dict[str, Any]:
    """Figures for `recipe` and the flat baseline on the same store and questions."""
    report: dict[str, Any] = {"k": k, "run_id": retriever.snapshot().run_id, "recipes": {}}
    for name in dict.fromkeys([recipe, baseline]):
        rows = [score_question(retriever, q, name, k, context_tokens) for q in questions]
        report["recipes"][name] = {**summarize(rows), "per_question": rows}
    return report


def print_report(report: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    k = report["k"]
    table = Table(title=f"tkg eval (snapshot {report['run_id']}), k = {k}")
    for column in ("recipe", "category", "questions", f"hit@{k}", f"recall@{k}",
                   "answer in context"):
        table.add_column(column, justify="left" if column in ("recipe", "category")
                         else "right", no_wrap=column == "recipe")
    for name, figures in report["recipes"].items():
        for category, f in [("overall", figures["overall"]), *figures["categories"].items()]:
            table.add_row(name, category, str(f["questions"]), f"{f['hit']:.3f}",
                          f"{f['recall']:.3f}", str(f.get("answer_in_context", "")))
    Console(width=120).print(table)
