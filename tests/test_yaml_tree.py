"""A text with no alias is built by one recursive walk (``inputs._TreeConstruct``) instead of
PyYAML's general constructor: the data and the errors must be the general path's."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from apportion import inputs
from apportion.errors import InputError

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                    st.floats(allow_nan=False), st.text(max_size=12))
keys = st.one_of(st.text(max_size=8), st.integers(-1000, 1000), st.booleans())
data = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(keys, inner, max_size=5)), max_leaves=30)


def _general(text: str) -> Any:
    return yaml.load(text, Loader=inputs._UniqueKeyLoader)


def _outcome(text: str, loader: type) -> tuple[str, Any]:
    try:
        return "ok", yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        return "error", (getattr(exc, "problem", None), getattr(exc, "context", None),
                         getattr(getattr(exc, "problem_mark", None), "line", None))


@settings(max_examples=150, deadline=None)
@given(data, st.sampled_from([None, False, True]))
def test_tree_walk_builds_what_the_general_constructor_builds(value: Any, flow: bool | None
                                                              ) -> None:
    text = yaml.safe_dump(value, default_flow_style=flow, allow_unicode=True)
    assume("*" not in text)
    expected = _outcome(text, inputs._UniqueKeyLoader)
    for loader in (inputs._TreeUniqueKeyLoader, inputs._FastTreeUniqueKeyLoader):
        assert _outcome(text, loader) == expected
    if expected[0] == "ok":
        assert inputs.parse_yaml_text(text, "t.yaml") == expected[1]


@pytest.mark.parametrize("text", [
    "a: 1\na: 2\n",                                   # a duplicate key
    "a: {b: 1, b: 2}\n",                              # one in a flow mapping
    "1: a\n1.0: b\n",                                 # equal keys of two types
    "? [1, 2]\n: 3\n",                                # an unhashable key
    "<<: {a: 1}\nb: 2\n",                             # a merge key without an alias
    "a: 2001-12-14\nb: !!set {x, y}\nc: !!binary aGVsbG8=\nd: !!omap [{k: 1}]\n",
    "a: !foo 1\n",                                    # a tag no safe constructor knows
    "x: [1, 2.5, .inf, ~, yes, 'no', 0x1F, 1_000, '1', !!str 3, !!int '7']\n",
    "- - - []\n  - {}\n- ''\n",
])
def test_tree_walk_on_the_general_paths_cases(text: str) -> None:
    expected = _outcome(text, inputs._UniqueKeyLoader)
    assert _outcome(text, inputs._TreeUniqueKeyLoader) == expected
    assert _outcome(text, inputs._FastTreeUniqueKeyLoader)[0] == expected[0]
    if expected[0] == "ok":
        assert inputs.parse_yaml_text(text, "t.yaml") == expected[1]
    else:
        with pytest.raises(InputError):
            inputs.parse_yaml_text(text, "t.yaml")
