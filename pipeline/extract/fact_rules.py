"""How the embedded extractor words a fact: which words of its sentence it keeps, and how
they read in the third person.

A fact is one claim (a verb, its subject and one object) said as a complete sentence in the
third person: the speaker's "I", "me" and "my" become their name, the addressee's "you" the
name of whoever spoke last before them, and the verb agrees ("I am" -> "Ana is", "I create"
-> "Ana creates"). It keeps what completes the claim (the object's own phrase with its
complement, the verb's adverbs, purposes and dates) and leaves out the sentence's other
claims (other objects with their own facts, coordinated clauses, greetings, vocatives).
A clause whose verb has no object still states something ("Fitness goals have been hard to
reach"): it becomes one fact of its speaker about its topic noun (`topic`). Which entities a
fact joins (a kind of thing is none) the extractor decides (`SpacyExtractor._anchored`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tkg.pipeline.extract.entity_rules import GREETINGS, is_written_name

if TYPE_CHECKING:
    from spacy.tokens import Doc, Token

SPEAKER_SUBJECTS = {"i", "we"}
SPEAKER_OBJECTS = {"me", "us"}
SPEAKER_POSSESSIVES = {"my", "our", "mine", "ours"}
SPEAKER_REFLEXIVES = {"myself", "ourselves"}
ADDRESSEE = {"you", "yourself", "yourselves"}
ADDRESSEE_POSSESSIVES = {"your", "yours"}
# Pronoun possessors a rule cannot resolve: "Their inclusivity spoke to me" names nobody.
UNRESOLVED_POSSESSORS = {"their", "his", "her", "its", "whose"}
# The verb after a first-person subject, in the third person singular.
THIRD_PERSON = {"am": "is", "'m": "is", "are": "is", "'re": "is", "were": "was",
                "have": "has", "'ve": "has", "do": "does", "'d": "would", "'ll": "will"}
# Dependents that are never part of a claim: greetings, fillers, coordinators.
NOT_CLAIM_DEPS = {"intj", "discourse", "cc", "punct", "dep", "meta", "preconj", "conj",
                  "parataxis", "appos"}
# A verb's dependents that are claims of their own (a fact's text keeps them only when
# they hold its object).
DIRECT_DEPS = {"dobj", "dative", "attr", "oprd"}
OWN_CLAIM_DEPS = {"prep", "agent", "dobj", "dative", "attr", "oprd", "pobj"}
# Words that open a sentence by linking it to the one before ("So I'm ...", "Plus, ...").
OPENERS = {"so", "plus", "anyway", "also", "and", "but", "then", "btw", "actually"}
LIST_MARKS = {",", ";", "(", ")", "[", "]"}  # where a noun's own phrase ends
FINITE_TAGS = {"VBD", "VBZ", "VBP", "MD"}
MAX_FACT_TOKENS = 40  # past this a text is cut back to the claim's core (subject, verb, object)
# Words that open a message without stating anything: greetings and fillers.
GREETING_WORDS = GREETINGS | {"wow", "well", "yes", "yeah", "yep", "no", "nope", "aw", "aww",
                              "hmm", "ah", "haha", "omg"}


@dataclass(frozen=True)
class Voices:
    """Who "I" and "you" are in a message: its speaker and the last other speaker; and
    every speaker of its window (`speakers`), people whatever NER calls them."""

    speaker: str | None
    addressee: str | None = None
    speakers: frozenset[str] = frozenset()


def addressee_of(speaker: str | None, context: Sequence[str]) -> str | None:
    """The last earlier speaker other than `speaker` in the window's context lines
    (`speaker: content`, `episode_kinds.context_line`), or None."""
    if not speaker:
        return None
    for line in reversed(context):
        name, sep, _ = line.partition(":")
        name = name.strip()
        if sep and name and name != speaker and len(name.split()) <= 4:
            return name
    return None


def window_speakers(speaker: str | None, context: Sequence[str]) -> frozenset[str]:
    """The speaker and the speakers of the window's context lines (`speaker: content`)."""
    names = {line.partition(":")[0].strip() for line in context if ":" in line}
    return frozenset(n for n in {*names, speaker} if n and len(n.split()) <= 4)


def is_vocative(token: Token) -> bool:
    """A name that addresses someone rather than says who acts ("Hey Caroline, I've had
    ..."): after a greeting, or set off by a comma before another subject of its verb."""
    if token.pos_ != "PROPN" and not is_written_name(token):  # "Caroline, those lessons ..."
        return False
    start = token.left_edge.i
    before = token.doc[start - 1] if start > 0 else None
    after = token.doc[token.right_edge.i + 1] if token.right_edge.i + 1 < len(token.doc) else None
    greeted = before is not None and (before.lower_ in GREETING_WORDS or before.pos_ == "INTJ")
    following = token.doc[token.i + 2] if token.i + 2 < len(token.doc) else None
    opening = following is not None and start == token.sent.start and (
        token.doc[token.i + 1].text == "," and following.pos_ != "PROPN"
        and not token.conjuncts)
    # "Caroline, those lessons are great" (not "Alice Walker, Mark Walker and ... moved")
    if greeted or opening:
        return True
    others = [c for c in token.head.children
              if c.dep_ in ("nsubj", "nsubjpass") and c.i > token.i]
    return after is not None and after.text == "," and bool(others)


def unresolved(subject: Token) -> bool:
    """A common-noun subject owned by a pronoun no rule resolves ("Their inclusivity")."""
    return subject.pos_ == "NOUN" and any(
        c.dep_ == "poss" and c.lower_ in UNRESOLVED_POSSESSORS for c in subject.children)


def misparsed_conjunct(verb: Token) -> bool:
    """A bare verb coordinated with a finite one and no subject or auxiliary of its own
    ("the haves and have nots" read as a second verb "have"): not a claim."""
    if verb.dep_ != "conj" or verb.tag_ != "VB":
        return False
    own = {c.dep_ for c in verb.children}
    return not own & {"nsubj", "nsubjpass", "aux", "auxpass"} and verb.head.tag_ in (
        "VBD", "VBN", "VBZ", "VBP", "VBG")


def unstated(verb: Token) -> bool:
    """A verb that states nothing: in a condition ("if you ever want to come") or inside
    brackets (an aside such as "[shares a photo of ...]")."""
    node = verb
    for _ in range(len(verb.doc)):  # up to the root
        if any(c.dep_ == "mark" and c.lower_ in ("if", "unless", "whether")
               for c in node.children):
            return True
        if node.head.i == node.i:
            break
        node = node.head
    before = verb.doc[verb.sent.start : verb.i].text
    return before.count("[") > before.count("]")


def claim_head(verb: Token) -> Token:
    """The verb that heads `verb`'s claim: up through open complements and purposes
    ("started working at", "plan to move to"), not through coordination."""
    head = verb
    while head.dep_ in ("xcomp", "advcl", "ccomp") and head.head is not head and (
            head.head.pos_ in ("VERB", "AUX")):
        head = head.head
    return head


def claim_indices(head: Token) -> list[int]:
    """The tokens of a claim: its head's subtree without coordinated clauses that have a
    subject of their own, and without leading greetings, fillers and vocatives."""
    skip = {t.i for child in head.children if _own_clause(child) or _aside(child)
            for t in child.subtree}
    return _trimmed(head.doc, [t.i for t in head.subtree if t.i not in skip])


def _own_clause(child: Token) -> bool:
    """A coordinated clause with a subject of its own ("..., and it was great"), a clause
    set beside it ("..., call me") or a condition ("if you want to come")."""
    return child.dep_ == "parataxis" or (
        child.dep_ == "conj" and child.pos_ in ("VERB", "AUX")
        and any(c.dep_ in ("nsubj", "nsubjpass") for c in child.children)) or (
        child.dep_ == "advcl" and any(c.dep_ == "mark" and c.lower_ in ("if", "unless")
                                      for c in child.children))


def _aside(child: Token) -> bool:
    """A greeting, a filler or a vocative hanging on a verb."""
    return child.dep_ in ("intj", "discourse", "meta") or (
        child.dep_ == "npadvmod" and child.pos_ == "PROPN") or (
        child.dep_ in ("nsubj", "nsubjpass") and is_vocative(child))


def fact_indices(verb: Token, subject: Token, target: Token, others: Iterable[int]) -> list[int]:
    """The words of one fact: its subject's phrase, the verb with whatever completes it
    (auxiliaries, negation, adverbs, complements, purposes, dates) except the branches that
    hold the verb's other objects (`others`: their token ids), the path down to the object
    and the object's own phrase with its complement ("a fun way to express ...")."""
    other = set(others)
    said = subject.head if subject.dep_ in ("appos", "compound", "nmod") and (
        subject.head.pos_ == "NOUN" and subject.i in phrase(subject.head)) else subject
    keep = set(phrase(said))  # a name with the noun it is said with: "John's colleague Rob"
    direct = any(c.dep_ in DIRECT_DEPS and target.i in {t.i for t in c.subtree}
                 for c in verb.children)
    head = verb  # a subject shared from a governing verb ("began working at") keeps it
    while True:
        keep.add(head.i)
        for child in head.children:
            if child.i == subject.i or child.dep_ in NOT_CLAIM_DEPS:
                continue
            if child.dep_ in ("nsubj", "nsubjpass", "expl", "csubj"):
                continue
            subtree = {t.i for t in child.subtree}
            if target.i in subtree:
                continue  # the path below adds it
            if head.i != verb.i and child.dep_ in OWN_CLAIM_DEPS - DIRECT_DEPS:
                continue
            if subtree & other and not (child.dep_ in DIRECT_DEPS and not direct):
                continue  # another object's own fact (a direct object completes the verb)
            if child.dep_ == "npadvmod" and child.pos_ == "PROPN":
                continue  # a vocative
            keep.update(subtree)
        if subject.head.i == head.i or head.dep_ not in ("xcomp", "advcl", "ccomp"):
            break
        head = head.head
    node, listed = target, False
    while node.i != verb.i and node.head.i != node.i:
        if node.i == target.i:
            keep.update(phrase(node))
        elif not listed:
            keep.add(node.i)
            keep.update(t.i for c in node.children
                        if c.dep_ in ("det", "poss", "amod", "compound", "nummod", "case",
                                      "quantmod", "nmod", "neg", "aux", "auxpass", "prt")
                        for t in c.subtree)
        listed = node.dep_ == "conj" or (  # a list's other items stay out ("A, B and C")
            node.dep_ == "appos" and node.pos_ == "PROPN" and node.head.pos_ == "PROPN")
        node = node.head
        while listed and node.dep_ == "conj" and node.head.i != node.i:
            node = node.head
    keep -= _listed_with(target, other)
    keep.update(t.i for t in verb.doc[min(keep) : max(keep) + 1]  # commas inside stay
                if t.is_punct and t.i - 1 in keep and t.i + 1 in keep)
    indices = _trimmed(verb.doc, sorted(keep))
    if len(indices) > MAX_FACT_TOKENS:  # the core only: subject, verb chain, object
        core = set(phrase(subject)) | {verb.i} | {
            c.i for c in verb.children if c.dep_ in ("aux", "auxpass", "neg", "prt")}
        node = target
        while node.i != verb.i and node.head.i != node.i:
            core.update(phrase(node, complements=False) if node.i == target.i else [node.i])
            node = node.head
        indices = _trimmed(verb.doc, sorted(core))
    return indices


def _listed_with(target: Token, other: set[int]) -> set[int]:
    """The words of the objects listed with `target` that are facts of their own (`other`)
    and the words that join them: "the Initech and Globex accounts" is the Initech accounts
    for Initech's fact and the Globex accounts for Globex's (one text each, so both stay)."""
    listed = [t for t in target.conjuncts if t.i in other]
    if not listed:
        return set()
    joins = {c.i for t in (target, *target.conjuncts) for c in t.children
             if c.dep_ == "cc" or (c.dep_ == "punct" and c.text in LIST_MARKS)}
    return joins | {i for t in listed for i in phrase(t)}


def complete(doc: Doc, indices: Sequence[int]) -> bool:
    """Whether the words hold a finite verb ("Ana plays the violin", not "Ana playing
    the violin": a coordinated gerund's fact without the verb that carries its tense)."""
    return any(doc[i].tag_ in FINITE_TAGS for i in indices)


def phrase(token: Token, complements: bool = True) -> list[int]:
    """A noun's own phrase: its subtree without its conjuncts and their coordinator, cut at
    a comma (a list of names is several objects), with its complement ("a way to relax",
    "the car shop I opened") unless `complements` is False."""
    skip_deps = {"conj", "cc"} | (set() if complements else {"relcl", "acl"})
    skip = {t.i for c in token.children if c.dep_ in skip_deps or (
        c.dep_ == "punct" and c.text in LIST_MARKS) for t in c.subtree}
    kept = [t.i for t in token.subtree if t.i not in skip]
    doc = token.doc
    run = [token.i]  # the contiguous run around the token, no comma inside
    kept_set = set(kept)
    low = token.i
    while low - 1 in kept_set and doc[low - 1].text not in LIST_MARKS:
        low -= 1
    high = token.i
    while high + 1 in kept_set and doc[high + 1].text not in LIST_MARKS:
        high += 1
    run = list(range(low, high + 1))
    return [i for i in run if i in kept_set]


def object_words(token: Token, limit: int = 4) -> tuple[str, ...]:
    """The lemmas that say what an object is ("a fun way" -> fun, way; "a lot of things"
    -> lot, of, thing), without determiners and owners, at most `limit`."""
    doc = token.doc
    words = [doc[i].lemma_.lower() for i in phrase(token, complements=False)
             if doc[i].dep_ not in ("det", "poss", "case", "predet") and not doc[i].is_punct
             and doc[i].pos_ != "PRON"]
    return tuple(words[:limit])


def topic(head: Token, indices: Sequence[int], exclude: Iterable[int]) -> Token | None:
    """The noun a claim without an object is about: a named thing in it first, then its
    subject, then its first other noun (never a pronoun or a date)."""
    doc = head.doc
    excluded = set(exclude)
    nouns = [doc[i] for i in indices if i not in excluded and doc[i].pos_ in ("NOUN", "PROPN")
             and doc[i].ent_type_ not in ("DATE", "TIME") and doc[i].dep_ != "compound"
             and not doc[i].like_num]
    if not nouns:
        return None
    named = [t for t in nouns if t.pos_ == "PROPN"]
    subjects = [t for t in nouns if t.dep_ in ("nsubj", "nsubjpass") and t.head.i == head.i]
    return (named or subjects or nouns)[0]


def render(doc: Doc, indices: Sequence[int], voices: Voices, subject: str | None) -> str:
    """The tokens as one sentence in the third person (the module's rules), capitalized,
    ending in a full stop. `subject` is the person the sentence's subject is, when it is
    the speaker or the addressee: their own things are "their" ("Ana sold their car")."""
    words: list[str] = []
    previous: int | None = None
    agree_next = False
    for index in indices:
        token = doc[index]
        text = _person(token, voices, subject)
        replaced = text != token.text
        if agree_next and token.pos_ in ("AUX", "VERB") and token.dep_ != "nsubj":
            third = _third_person(token)
            replaced = replaced or third != token.text
            text = third
            agree_next = False
        elif agree_next and token.pos_ not in ("ADV", "PART"):
            agree_next = False
        if _subject_word(token) and (
                (token.lower_ in ("i", "we") and voices.speaker)
                or (token.lower_ == "you" and voices.addressee)
                or token.tag_ in ("NN", "NNP")):  # "Max and I love" -> "Max loves"
            agree_next = True
        spaced = words and (previous is None or index != previous + 1
                            or bool(doc[previous].whitespace_)
                            or (replaced and token.text.startswith("'")))
        words.append((" " if spaced else "") + text)
        previous = index
    sentence = "".join(words).strip(" ,;:-–—")
    if not sentence:
        return ""
    sentence = sentence[0].upper() + sentence[1:]
    return sentence if sentence.endswith((".", "!", "?")) else f"{sentence}."


def _subject_word(token: Token) -> bool:
    """The head word of a subject, or of one of its conjuncts."""
    return token.dep_ in ("nsubj", "nsubjpass") or (
        token.dep_ == "conj" and token.head.dep_ in ("nsubj", "nsubjpass"))


def _person(token: Token, voices: Voices, subject: str | None) -> str:
    lower = token.lower_
    speaker, addressee = voices.speaker, voices.addressee
    if speaker:
        if lower in SPEAKER_SUBJECTS or lower in SPEAKER_OBJECTS:
            return speaker
        if lower in SPEAKER_POSSESSIVES:
            return "their" if subject == speaker and lower in ("my", "our") else f"{speaker}'s"
        if lower in SPEAKER_REFLEXIVES:
            return "themselves" if subject == speaker else speaker
    if addressee:
        if lower in ADDRESSEE:
            return "themselves" if subject == addressee and lower != "you" else addressee
        if lower in ADDRESSEE_POSSESSIVES:
            return "their" if subject == addressee and lower == "your" else f"{addressee}'s"
    return token.text


def _third_person(token: Token) -> str:
    """A verb after "I"/"we" as it reads after a name: am -> is, create -> creates."""
    lower = token.lower_
    if lower in THIRD_PERSON:
        if lower == "'d" and token.tag_ == "VBD":
            return "had"
        return THIRD_PERSON[lower]
    if token.tag_ != "VBP":
        return token.text
    if lower.endswith(("s", "sh", "ch", "x", "z", "o")):
        return token.text + "es"
    if lower.endswith("y") and len(lower) > 1 and lower[-2] not in "aeiou":
        return token.text[:-1] + "ies"
    return token.text + "s"


def _trimmed(doc: Doc, indices: list[int]) -> list[int]:
    """Without leading and trailing punctuation, coordinators and greeting words."""
    while indices and (doc[indices[0]].is_punct or doc[indices[0]].dep_ in ("cc", "intj", "mark")
                       or (doc[indices[0]].tag_ == "WRB" and len(indices) > 1)
                       or doc[indices[0]].lower_ in GREETING_WORDS - {"no"}
                       or (doc[indices[0]].lower_ in OPENERS and len(indices) > 1
                           and doc[indices[0]].head.i != indices[1])):
        indices = indices[1:]
    while indices and (doc[indices[-1]].is_punct or doc[indices[-1]].dep_ == "cc"):
        indices = indices[:-1]
    return indices
