"""The one registry type behind every pluggable backend: each config literal that picks a
backend names exactly the registered entries (plus `none` where no backend is a choice),
every lazy entry imports, and an unknown name says which are known."""

from __future__ import annotations

import typing

import pytest
from tkg.pipeline.adjudicate import INVALIDATION_JUDGES, PAIR_JUDGES
from tkg.pipeline.communities import SUMMARIZERS
from tkg.pipeline.config import TkgConfig
from tkg.pipeline.embed import EMBEDDERS
from tkg.pipeline.extract import EXTRACTORS
from tkg.pipeline.llm import LLMS
from tkg.pipeline.registry import Registry, UnknownBackend

CHOICES = {  # config field that picks a backend -> the registry it picks from
    ("extract", "backend"): EXTRACTORS,
    ("embed", "backend"): EMBEDDERS,
    ("llm", "backend"): LLMS,
    ("resolve", "adjudicator"): PAIR_JUDGES,
    ("facts", "invalidation_judge"): INVALIDATION_JUDGES,
    ("communities", "summarizer"): SUMMARIZERS,
}


def literal(section: str, field: str) -> set[str]:
    model = TkgConfig.model_fields[section].annotation
    return set(typing.get_args(model.model_fields[field].annotation))


@pytest.mark.parametrize(("section", "field"), list(CHOICES))
def test_config_literal_names_exactly_the_registered_backends(section, field):
    assert literal(section, field) - {"none"} == set(CHOICES[section, field].names())


@pytest.mark.parametrize("registry", list(CHOICES.values()), ids=lambda r: r.kind)
def test_every_entry_resolves_to_a_factory(registry):
    for name in registry:
        assert callable(registry.factory(name)), name


def test_unknown_backend_lists_the_known_ones():
    registry: Registry[str] = Registry("greeter")
    registry.register("hello", "builtins:str")

    @registry.register("shout")
    def shout(text: str) -> str:
        return text.upper()

    assert registry.build("hello", 12) == "12" and registry.build("shout", "hi") == "HI"
    with pytest.raises(UnknownBackend, match=r"unknown greeter 'nope' \(known: hello, shout\)"):
        registry.build("nope")


def test_no_llm_backend_is_a_config_error():
    from tkg.pipeline.llm import build_llm

    with pytest.raises(ValueError, match=r"llm\.backend is 'none'.*openai"):
        build_llm(TkgConfig().llm)
    for needs in ({"resolve": {"adjudicator": "llm"}},
                  {"facts": {"invalidation_judge": "llm"}},
                  {"communities": {"summarizer": "llm"}}):
        with pytest.raises(ValueError, match=r"llm\.backend is none"):
            TkgConfig.model_validate(needs)
