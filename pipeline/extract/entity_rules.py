"""What in a spaCy parse is an entity a person would list, by linguistic evidence alone (no
word lists of the data): a name or a specific thing, never a generic noun, a quantity or a
greeting's addressee.

A phrase is specific when one of its words is a name or a code: a token spaCy's NER puts in a
named span, or a noun capitalized where a sentence does not start there (or tagged a proper
noun where it does), or a code that mixes letters and digits ("T-23", "ORD-1001"), or a
number that follows a capitalized word ("Room 101"). Adjectives ("the European customers")
and counts ("120 seats") are no such evidence. `tkg bench graph`'s generic-noun share of the
extracted entities (by normalized name), before -> after, with the facts of one entity
that fact_rules.py words alongside: tests/corpus 0.465 -> 0.091 (0.022 with
`extract.common_noun_facts: false`), the podcast 0.743 -> 0.009, LoCoMo's first
conversation 0.829 -> 0.062 (0.0). Then a membership of a kind of thing and a noun with a
name beside it ("my partner Jenna") went into their relations (spacy_extractor._folded,
_named_by): `tkg bench graph` on the built stores, LoCoMo 0.143 -> 0.021.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from spacy.tokens import Span, Token

# NER labels of names (DATE, MONEY, CARDINAL ... are values, not names).
NAMED_NER = {"PERSON", "ORG", "GPE", "LOC", "FAC", "PRODUCT", "NORP", "EVENT", "WORK_OF_ART",
             "LAW", "LANGUAGE"}
TRIM_WORDS = {"the", "a", "an", "my", "our", "your", "his", "her", "their", "its", "this",
              "that", "these", "those", "some", "any", "all", "every", "no"}
# Words that open a greeting or a thank-you: "Hi Marcus" names Marcus, not "Hi Marcus".
GREETINGS = {"hi", "hello", "hey", "heya", "hiya", "thanks", "thank", "thx", "dear", "morning",
             "evening", "good", "bye", "cheers", "congrats", "congratulations", "welcome", "yo",
             "ok", "okay", "oh", "sorry", "please"}
# Punctuation inside a span ends a name: a noun chunk over "Quick, Dorothy! Run" is three.
BREAKS = {",", ";", ":", "!", "?", "—", "–", "(", ")", '"'}
# How an addressed name hangs in a parse: a bare noun phrase beside the clause.
ADDRESS_DEPS = {"npadvmod", "intj", "ROOT", "dep", "nsubj", "attr", "appos"}
# A capitalized word after a lower-case word: written as a name, not as a sentence start
# (after a comma chat starts sentences too: "Wow, It's ...").
WRITTEN_NAME = re.compile(r"(?<=[a-z0-9] )[A-Z][a-z]+(?:-[A-Z][a-z]+)?\b")
WRITTEN_NAMES = "written_names"  # the doc's user data key
# Prepositions of time: what follows them is an event or a period, never a person
# ("especially after Covid", "during Katrina").
TIME_PREPOSITIONS = {"during", "after", "before", "since", "throughout", "amid", "until"}


def name_tokens(span: Span) -> list[Token]:
    """The tokens that name a span: the part between punctuation that holds the span's root,
    without leading determiners, possessives and greetings or trailing punctuation."""
    tokens = list(span)
    root = span.root
    cuts = [i for i, t in enumerate(tokens) if t.text in BREAKS]
    start, end = 0, len(tokens)
    for cut in cuts:
        if tokens[cut].i < root.i:
            start = cut + 1
        elif cut < end:
            end = cut
    tokens = tokens[start:end] or tokens
    while tokens and (tokens[0].lower_ in TRIM_WORDS or tokens[0].pos_ in ("DET", "PRON")
                      or tokens[0].lower_ in GREETINGS or tokens[0].pos_ == "INTJ"
                      or tokens[0].is_punct):
        tokens = tokens[1:]
    while tokens and (tokens[-1].is_punct or tokens[-1].tag_ == "POS"):
        tokens = tokens[:-1]
    return tokens


def _sentence_start(token: Token) -> bool:
    sent = token.sent
    first = next((t for t in sent if not t.is_punct), sent[0])
    return token.i <= first.i


def written_names(texts: Iterable[str]) -> frozenset[str]:
    """The words that `texts` (an episode and its context lines, `speaker: content`) write
    as names: capitalized where no sentence starts (after a lower-case word), and the words
    of the speakers' names. spaCy's small model tags a sentence-initial surname a common
    noun ("Tetlow taught at Tulane"); the same word written as a name nearby says it is one."""
    found: set[str] = set()
    for text in texts:
        speaker, sep, _ = text.partition(": ")
        if sep and 0 < len(speaker.split()) <= 4 and all(w[:1].isupper() for w in speaker.split()):
            found.update(speaker.split())
        found.update(WRITTEN_NAME.findall(text))
    return frozenset(found - {"I"})


def is_written_name(token: Token) -> bool:
    """A noun the episode or its context writes as a name elsewhere (`written_names`, kept
    in the doc's user data by the extractor)."""
    return token.pos_ in ("NOUN", "PROPN") and token.text in token.doc.user_data.get(
        WRITTEN_NAMES, ())


def _capitalized_name(token: Token) -> bool:
    """A word written as a name: a capital letter where the sentence does not start (or a
    proper noun tag, or the same word written as a name nearby, where it does), never the
    pronoun "I" or an adjective."""
    if token.pos_ in ("ADJ", "PRON", "DET", "ADP", "VERB", "AUX", "INTJ", "ADV"):
        return False
    if not any(c.isupper() for c in token.text) or token.text == "I":
        return False
    return (not _sentence_start(token) or token.pos_ == "PROPN"
            or token.ent_type_ in NAMED_NER or is_written_name(token))


def _code(token: Token, previous: Token | None) -> bool:
    text = token.text
    has_digit = any(c.isdigit() for c in text)
    if has_digit and any(c.isalpha() for c in text):
        return True  # "T-23", "ORD-1001", "Q1"
    return has_digit and previous is not None and previous.text[:1].isupper() and (
        previous.pos_ in ("PROPN", "NOUN"))  # "Room 101", "Order 1001"


def is_specific(tokens: list[Token]) -> bool:
    """Whether a phrase names something (a name or a code) rather than a kind of thing."""
    previous = None
    for token in tokens:
        if _code(token, previous) or _capitalized_name(token):
            return True
        if token.ent_type_ in NAMED_NER and token.pos_ != "ADJ" and (
                token.text[:1].isupper() or any(c.isdigit() for c in token.text)):
            return True
        previous = token
    return False


def is_vocative(span: Span) -> bool:
    """A name that only greets, thanks or addresses someone: "Hi Marcus", "Thanks, Anna!",
    "Quick, Dorothy, ...", "ya, Melanie, ...", "Well deserved, Marcus." Such a name is set
    off from its clause (by a greeting, an interjection or a sentence edge before it and by
    punctuation after it) and fills no place in it (no object, no conjunct, no apposition to
    a noun: "my boss, Anna, ...")."""
    tokens = name_tokens(span)
    if not tokens:
        return False
    first, last, doc = tokens[0], tokens[-1], span.doc
    before = _previous_word(doc, first.i)
    after = doc[last.i + 1] if last.i + 1 < len(doc) else None
    if before is not None and (before.lower_ in GREETINGS or before.pos_ == "INTJ"):
        return True  # "Hey Caroline", "Thanks Anna"
    root = span.root if span.root in tokens else tokens[-1]
    if root.dep_ not in ADDRESS_DEPS or root.conjuncts or (
            root.dep_ == "appos" and root.head.pos_ in ("NOUN", "PROPN")):
        return False
    if root.dep_ in ("nsubj", "attr") and (after is None or after.text != ","):
        return False  # a subject or a predicate, not an address
    set_off_after = after is None or after.text in {",", "!", "?", ".", ";", "…"} or (
        after.is_sent_start)
    set_off_before = (before is None or _sentence_start(first)
                      or doc[first.i - 1].text in {",", "!", "?", ".", ";", "…"})
    return set_off_before and set_off_after and all(
        t.pos_ == "PROPN" or t.ent_type_ == "PERSON" for t in tokens)


def _previous_word(doc, index: int) -> Token | None:
    """The word before a token, skipping one comma ("Thanks, Anna")."""
    before = doc[index - 1] if index > 0 else None
    if before is not None and before.text == "," and index > 1:
        return doc[index - 2]
    return before


def after_time_preposition(tokens: list[Token]) -> bool:
    """A name governed by a preposition of time ("after Covid"): an event, not a person."""
    head = tokens[-1].head if tokens else None
    return head is not None and head.dep_ == "prep" and head.lower_ in TIME_PREPOSITIONS
