"""A validated ``QuotaConfig`` as plain attributes, for processes that cannot import pydantic.

The tuning job's replay runs the quota engines on Spark executors, whose Python has pyspark's own
dependencies (pandas, pyarrow, numpy) and whatever the job ships in its zip, but not pydantic,
whose core is compiled and cannot be imported from a zip. The engines only read attributes, call
``get(key)`` on quota values and ``quota_window()`` on windows, so the driver validates the
config with pydantic and sends this copy of it, which unpickles with the standard library alone.
"""

from __future__ import annotations

from typing import Any

from quota.rate import QuotaWindow


class PlainModel:
    """The fields of one config model as attributes (frozen by convention, as the model is)."""

    def __init__(self, fields: dict[str, Any]) -> None:
        self.__dict__.update(fields)

    def get(self, key: str) -> Any:
        return getattr(self, key)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.__dict__!r})"


class PlainWindow(PlainModel):
    """A sampling window config (``num``, ``size_seconds``)."""

    num: int
    size_seconds: float

    def quota_window(self) -> QuotaWindow:
        return QuotaWindow(self.num, self.size_seconds * 1000.0)


def plain(value: Any) -> Any:
    """``value`` with every pydantic model in it (found by its ``model_fields``) made plain."""
    fields = getattr(type(value), "model_fields", None)
    if isinstance(fields, dict):
        kind = PlainWindow if hasattr(value, "quota_window") else PlainModel
        return kind({name: plain(getattr(value, name)) for name in fields})
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(plain(item) for item in value)
    return value
