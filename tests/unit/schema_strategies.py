"""Hypothesis strategies that build valid message bodies straight from Kafka's JSON schemas."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from hypothesis import strategies as st

from protocol.schema import _in, parse_versions, snake

_INTS = {
    "int8": st.integers(-(2**7), 2**7 - 1),
    "int16": st.integers(-(2**15), 2**15 - 1),
    "int32": st.integers(-(2**31), 2**31 - 1),
    "int64": st.integers(-(2**63), 2**63 - 1),
    "uint16": st.integers(0, 2**16 - 1),
}


def _primitive(ftype: str, nullable: bool) -> st.SearchStrategy[Any]:
    if ftype in _INTS:
        return _INTS[ftype]
    base: st.SearchStrategy[Any]
    if ftype == "bool":
        return st.booleans()
    if ftype == "float64":
        return st.floats(allow_nan=False)
    if ftype == "uuid":
        return st.binary(min_size=16, max_size=16)
    if ftype == "string":
        base = st.text(max_size=12)
    elif ftype == "bytes":
        base = st.binary(max_size=24)
    elif ftype == "records":
        return st.one_of(
            st.none(), st.binary(max_size=64).map(cast("Callable[[bytes], memoryview]", memoryview))
        )
    else:
        raise AssertionError(ftype)
    return st.one_of(st.none(), base) if nullable else base


def struct_strategy(fields: list[dict[str, Any]], version: int, flexible: bool) -> st.SearchStrategy[Any]:
    required: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for field in fields:
        if not _in(version, parse_versions(field.get("versions"))):
            continue
        strat = field_strategy(field, version, flexible)
        if flexible and _in(version, parse_versions(field.get("taggedVersions"))):
            optional[snake(field["name"])] = strat
        else:
            required[snake(field["name"])] = strat
    result: st.SearchStrategy[Any] = st.fixed_dictionaries(required, optional=optional)
    if flexible:
        unknown = st.dictionaries(st.integers(100, 140), st.binary(max_size=8), max_size=2)
        result = st.tuples(result, unknown).map(lambda t: {**t[0], "_unknown_tags": t[1]} if t[1] else t[0])
    return result


def field_strategy(field: dict[str, Any], version: int, flexible: bool) -> st.SearchStrategy[Any]:
    ftype: str = field["type"]
    nullable = _in(version, parse_versions(field.get("nullableVersions")))
    flexible = flexible and field.get("flexibleVersions") != "none"
    if ftype.startswith("[]"):
        elem = ftype[2:]
        inner = (
            struct_strategy(field["fields"], version, flexible)
            if elem[0].isupper()
            else _primitive(elem, nullable=False)
        )
        arr = st.lists(inner, max_size=3)
        return st.one_of(st.none(), arr) if nullable else arr
    if ftype[0].isupper():
        sub = struct_strategy(field["fields"], version, flexible)
        return st.one_of(st.none(), sub) if nullable else sub
    return _primitive(ftype, nullable)
