"""Package attributes loaded on first use (PEP 562): a package's ``__init__`` lists where each name lives, and only
the module of a name asked for is imported (``max-profile --help`` and ``import max_profile.model.tags`` stay light)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_attributes(namespace: dict[str, Any], where: Mapping[str, str]) -> Callable[[str], object]:
    """The module ``__getattr__`` of a package whose name ``n`` lives in module ``where[n]``: imported on first use and
    kept in the package's ``namespace`` (its ``globals()``) after."""

    def __getattr__(name: str) -> object:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {namespace.get('__name__')!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
