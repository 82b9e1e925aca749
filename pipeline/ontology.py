"""The ontology a build runs with: the declared entity types (`ontology.entity_types`, then
the built-in ones) and relation classes (`facts.relation_classes`, with the declared relation
types merged in by pipeline/config.py), read by both extraction paths: the spaCy path types
its names with it (`Ontology.type_of`, `Ontology.endpoint`), the LLM prompt lists it
(pipeline/llm/prompting.py).

A name's type comes from the strongest evidence it has: its own first or last word (a type's
`name_words`, the legal suffixes and honorifics of `resolve`: "Globex Corporation",
"Riverside Elementary", "Dr. Patel"), then a relation it is an end of (a type of the
relation class's `target_types`/`source_types`: "joined Contoso"), then spaCy's NER label.
"""

from __future__ import annotations

from collections.abc import Sequence

from tkg.pipeline.config import (
    DEFAULT_ENTITY_TYPES,
    EntityType,
    OntologyConfig,
    RelationClass,
    TkgConfig,
)


def entity_types(ontology: OntologyConfig) -> tuple[EntityType, ...]:
    """The declared entity types, then the built-in ones not declared again."""
    declared = {t.name for t in ontology.entity_types}
    return (*ontology.entity_types, *(t for t in DEFAULT_ENTITY_TYPES if t.name not in declared))


class Ontology:
    def __init__(self, config: TkgConfig) -> None:
        self.types: tuple[EntityType, ...] = entity_types(config.ontology)
        self.facts = config.facts
        self.by_ner: dict[str, str] = {}
        self.by_word: dict[str, str] = {}
        for entity_type in self.types:  # the first type that claims a label or word keeps it
            for ner in entity_type.ner:
                self.by_ner.setdefault(ner, entity_type.name)
            for word in entity_type.name_words:
                self.by_word.setdefault(word.casefold(), entity_type.name)
        for words, ner in ((config.resolve.legal_suffixes, "ORG"),
                           (config.resolve.honorifics, "PERSON")):
            if ner in self.by_ner:
                for word in words:
                    self.by_word.setdefault(word.casefold(), self.by_ner[ner])
        self.names = {t.name for t in self.types}
        for declared in config.ontology.relation_types:  # merged into facts by the config
            unknown = sorted(set(declared.source_types + declared.target_types) - self.names)
            if unknown:
                raise ValueError(f"ontology.relation_types {declared.name!r} names entity "
                                 f"types {unknown} that ontology.entity_types does not declare")

    def ner_type(self, ner_label: str) -> str | None:
        """The type an NER label stands for, or None (a label no type claims)."""
        return self.by_ner.get(ner_label)

    def word_type(self, words: Sequence[str]) -> str | None:
        """The type a name's own words give it: its last word (the head of an English name:
        "Riverside Elementary"), else its first ("University of Chicago", "Dr. Lee")."""
        folded = [w.casefold().strip(".") for w in words if w.strip(".")]
        if len(folded) < 2:  # "Head" or "Court" alone says nothing
            return None
        return self.by_word.get(folded[-1]) or self.by_word.get(folded[0])

    def relation_class(self, relation: str) -> RelationClass | None:
        base = relation.removeprefix(self.facts.negation_prefix)
        for cls in self.facts.relation_classes:
            if base == cls.relation or base in cls.synonyms:
                return cls
        return None

    def endpoint(self, relation: str, role: str, label: str, strong: bool) -> str:
        """The type of an end (`role`: "source" or "target") of `relation`: the first type
        its class allows for that end, unless the end has one of them or a type its own
        words gave it (`strong`: "Riverside Elementary" stays an Organization whatever
        relation it is in). spaCy's small model often calls a company a person or a
        product ("I joined Contoso": PERSON); the relation decides better."""
        cls = self.relation_class(relation)
        allowed = () if cls is None else (cls.source_types if role == "source"
                                           else cls.target_types)
        if not allowed or label in allowed or strong:
            return label
        return allowed[0]
