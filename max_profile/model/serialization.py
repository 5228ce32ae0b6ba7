"""Versions, the JSON encoding of the model (numpy values as plain JSON), and the checks a file must pass to load."""

from __future__ import annotations

import math
import sys
from typing import Any, Literal

import msgspec

from max_profile.errors import TraceFormatError

SCHEMA_VERSION = 3


"""Bumped whenever a field changes meaning or is removed (adding optional fields keeps it).

2: kernels stored as columns (:class:`KernelTable`); serve requests, ncu launches, preflight and
artifacts are part of the raw capture; the breakdown says which step source and attribution it used.
3: a raw capture says what it could not measure as :class:`Unavailable` (as a report does), not a string."""


READABLE_RAW_VERSIONS = (1, 2, 3)


"""Raw captures of these versions load (versions 1 and 2 are converted on load)."""


READABLE_REPORT_VERSIONS = (1, 2, 3)


"""Reports of these versions load as saved (a version-1 report keeps its older analysis; re-analyse its raw capture)."""


Phase = Literal["prefill", "decode", "mixed", "unknown"]


Severity = Literal["info", "warning", "error"]


Vendor = Literal["nvidia", "amd", "none"]


def _enc_hook(obj: object) -> object:
    """numpy arrays and scalars (collection and analysis use them) encode as plain JSON values. Told apart by their
    ``tolist`` / ``item``, not by type: this module does not import numpy, so a saved report is shown without it."""
    for name in ("tolist", "item"):
        convert = getattr(obj, name, None)
        if callable(convert):
            return convert()
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


def _dec_hook(tp: type, obj: object) -> object:
    np = sys.modules.get("numpy")  # a struct with an array field was defined by a module that imported numpy
    if np is not None and tp is np.ndarray:
        try:
            return np.asarray(obj)
        except (ValueError, TypeError) as exc:
            raise msgspec.ValidationError(f"not a numeric array ({exc})") from exc
    if tp is object:
        return obj
    raise NotImplementedError(f"cannot decode {tp}")


NON_NEGATIVE_SUFFIXES = (
    "_ms",
    "_ns",
    "_us",
    "_s",
    "_pct",
    "bytes",
    "kernels",
    "steps",
    "count",
    "tokens",
    "requests",
    "samples",
    "_mhz",
    "batch_size",
    "index",
)


"""Numbers under keys ending like these are times, shares or counts: never negative in a valid capture or report."""


SIGNED_KEYS = ("growth", "correlation", "delta", "slope", "change", "gain")


"""Keys that may be negative: trends, and changes between two measurements (a step that got faster, a throughput that
fell)."""


def find_impossible_number(doc: object, key: str = "") -> str | None:
    """The first NaN, infinity or negative time / count in a decoded document (``key = value``), or None."""
    if isinstance(doc, dict):
        if "name_idx" in doc and "start_ns" in doc:
            # a kernel table: -1 marks unknown launches, and invalid records are the analysis's to drop and count
            return None
        for k, v in doc.items():
            if k == "kernels" and isinstance(v, list) and v and isinstance(v[0], list):
                continue  # a version-1 kernel table (rows as arrays): the same holds as for the columns above
            found = find_impossible_number(v, str(k))
            if found:
                return found
    elif isinstance(doc, list):
        for v in doc:
            found = find_impossible_number(v, key)
            if found:
                return found
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        if isinstance(doc, float) and not math.isfinite(doc):
            return f"{key} = {doc}"
        if doc < 0 and key.endswith(NON_NEGATIVE_SUFFIXES) and not any(s in key for s in SIGNED_KEYS):
            return f"{key} = {doc}"
        if isinstance(doc, int) and abs(doc) >= 1 << 63:
            return f"{key} = {doc} (beyond 64 bits)"
    return None


def _encode(obj: object) -> bytes:
    return msgspec.json.encode(obj, enc_hook=_enc_hook)


def _decode_doc(data: bytes, path: str) -> dict[str, Any]:
    try:
        doc = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise TraceFormatError(f"{path}: not valid JSON ({exc}); truncated?") from exc
    except RecursionError as exc:
        raise TraceFormatError(f"{path}: JSON nested too deep; not a max_profile capture or report") from exc
    if not isinstance(doc, dict):
        raise TraceFormatError(f"{path}: a JSON {type(doc).__name__}, not a max_profile capture or report")
    try:
        bad = find_impossible_number(doc)
    except RecursionError as exc:
        raise TraceFormatError(f"{path}: JSON nested too deep; not a max_profile capture or report") from exc
    if bad:
        raise TraceFormatError(f"{path}: impossible value {bad}: damaged or not written by max_profile")
    return doc


def _validated(data: bytes, tp: type, path: str) -> Any:
    try:
        return msgspec.json.decode(data, type=tp, dec_hook=_dec_hook)
    except msgspec.ValidationError as exc:
        raise TraceFormatError(f"{path}: not a valid max_profile {tp.__name__}: {exc}") from exc
    except RecursionError as exc:
        raise TraceFormatError(f"{path}: JSON nested too deep; not a max_profile {tp.__name__}") from exc
    except TraceFormatError as exc:
        raise TraceFormatError(f"{path}: {exc}") from exc
