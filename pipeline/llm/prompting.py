"""Prompt templates are data (`prompts/*.yaml`, versioned); this module renders them.

Templates use `string.Template` placeholders (`$name`), so JSON braces in a prompt need no
escaping and a `$` inside user content is never interpreted (only the template is parsed).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import UTC
from functools import cache
from importlib import resources
from string import Template

import yaml
from tkg.pipeline.config import EntityType, FactsConfig, OntologyConfig, RelationClass
from tkg.pipeline.episode_kinds import prompt_header
from tkg.pipeline.extract.base import EpisodeInput, Extraction
from tkg.pipeline.llm.base import ChatRequest
from tkg.pipeline.llm.schemas import EXTRACTION_SCHEMA
from tkg.pipeline.ontology import entity_types

PACKAGE = "tkg.pipeline.llm.prompts"
MAX_RAW_ECHO = 4000  # characters of a bad answer echoed back in the retry


@dataclass(frozen=True)
class Prompt:
    name: str
    version: int
    system: str
    user: str

    def messages(self, **values: str) -> tuple[dict[str, str], ...]:
        """System and user messages; a missing placeholder value is a KeyError."""
        user = Template(self.user).substitute(values)
        system = Template(self.system).substitute(values) if self.system else ""
        out = ({"role": "system", "content": system.strip()},) if system.strip() else ()
        return (*out, {"role": "user", "content": user.strip()})


@cache
def load_prompt(name: str) -> Prompt:
    """A template by name from the package's prompt files."""
    path = resources.files(PACKAGE) / f"{name}.yaml"
    if not path.is_file():
        raise FileNotFoundError(f"no prompt template {name!r} in {PACKAGE}")
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return Prompt(name=data["name"], version=int(data["version"]), system=data.get("system")
                  or "", user=data["user"])


def prompt_set_version() -> str:
    """A short hash of every template: which prompts produced a run's extractions."""
    digest = hashlib.sha256()
    for item in sorted(resources.files(PACKAGE).iterdir(), key=lambda p: p.name):
        if item.name.endswith(".yaml"):
            digest.update(item.name.encode() + item.read_bytes())
    return digest.hexdigest()[:12]


def relation_guide(facts: FactsConfig) -> str:
    """The relation classes (the ontology's relation types among them) as the extraction
    prompt lists them: the LLM groups wordings by meaning itself ("accepted an offer from" is
    WORKS_AT), as `RelationClassifier` does for spaCy's phrases, from the same classes and
    prototype sentences, with the types each end may have and whether it holds one value at
    a time (what decides invalidation)."""
    lines = []
    classes: tuple[RelationClass, ...] = (*facts.relation_classes, facts.ending)
    for cls in classes:
        examples = "; ".join(f'"{p}"' for p in cls.prototypes[:3])
        ends = [f"{role} {' or '.join(types)}" for role, types in (
            ("from", cls.source_types), ("to", cls.target_types)) if types]
        notes = [cls.description, *ends] + (["one at a time"] if cls.exclusive and cls is not
                                           facts.ending else [])
        lines.append(f"  - {cls.relation} ({cls.name}" + "".join(f"; {n}" for n in notes if n)
                     + ")" + (f": {examples}" if examples else ""))
    return "\n".join(lines)


def entity_guide(ontology: OntologyConfig) -> str:
    """The entity types as the extraction prompt lists them: name, description, attributes."""
    lines = []
    declared: tuple[EntityType, ...] = entity_types(ontology)
    for entity_type in declared:
        attributes = (f" (attributes: {', '.join(entity_type.attributes)})"
                      if entity_type.attributes else "")
        lines.append(f"  - {entity_type.name}: {entity_type.description}{attributes}")
    return "\n".join(lines)


def _episode_values(episode: EpisodeInput, context_messages: int) -> dict[str, str]:
    context = list(episode.context)[-context_messages:] if context_messages else []
    return {
        "reference_time": episode.valid_at.astimezone(UTC).isoformat().replace("+00:00", "Z"),
        "kind": episode.kind,
        "header": prompt_header(episode),
        "context": "\n".join(f"- {line}" for line in context) or "(none)",
        "content": episode.content,
    }


def extraction_request(episode: EpisodeInput, context_messages: int,
                       facts: FactsConfig | None = None,
                       ontology: OntologyConfig | None = None) -> ChatRequest:
    """The one call per episode: entities and facts together, under the output schema, with
    the last `context_messages` (extract.context_messages) messages as context and the
    relation classes of `facts` and entity types of `ontology` (the configured defaults
    when None) named in the prompt."""
    values = _episode_values(episode, context_messages)
    values["relations"] = relation_guide(facts or FactsConfig())
    values["entity_types"] = entity_guide(ontology or OntologyConfig())
    messages = load_prompt("extract").messages(**values)
    return ChatRequest(messages=messages, schema=EXTRACTION_SCHEMA, schema_name="extraction")


def reflexion_request(episode: EpisodeInput, found: Extraction,
                      context_messages: int) -> ChatRequest:
    """The optional second pass: what the first answer missed."""
    so_far = {
        "entities": [{"name": e.name, "label": e.label} for e in found.entities],
        "facts": [{"source": f.source, "target": f.target, "relation": f.relation,
                   "fact": f.fact} for f in found.facts],
    }
    values = _episode_values(episode, context_messages)
    values["extraction"] = json.dumps(so_far, ensure_ascii=False)
    return ChatRequest(messages=load_prompt("reflexion").messages(**values),
                       schema=EXTRACTION_SCHEMA, schema_name="extraction")


def retry_request(request: ChatRequest, raw: str | None, error: str) -> ChatRequest:
    """The same request, followed by the unusable answer and what was wrong with it."""
    echoed = (raw or "")[:MAX_RAW_ECHO]
    follow = load_prompt("retry").messages(error=error)
    return ChatRequest(
        messages=(*request.messages, {"role": "assistant", "content": echoed}, *follow),
        schema=request.schema, schema_name=request.schema_name,
    )


def items_request(name: str, items: list[dict], schema: dict, schema_name: str) -> ChatRequest:
    """A batched judgement or summary: items as JSON lines under one template."""
    lines = "\n".join(json.dumps(item, ensure_ascii=False, default=str) for item in items)
    return ChatRequest(messages=load_prompt(name).messages(items=lines), schema=schema,
                       schema_name=schema_name)
