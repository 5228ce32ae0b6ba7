"""A saved file of max_profile's own, read as what it is: a report or a raw capture."""

from __future__ import annotations

from typing import TYPE_CHECKING

from max_profile.model.report import Report
from max_profile.model.serialization import _decode_doc
from max_profile.util.files import read_input

if TYPE_CHECKING:
    from max_profile.model.raw import RawCapture


def load_saved(path: str) -> RawCapture | Report:
    """A saved raw capture or report, told apart by content (a report has findings). A report loads without the raw
    capture's module and its kernel table (numpy): ``max-profile report REPORT.json`` starts in a quarter second."""
    data = read_input(path)
    doc = _decode_doc(data, path)
    if "findings" in doc:
        return Report.from_json(data, path, doc)
    from max_profile.model.raw import RawCapture

    return RawCapture.from_json(data, path, doc)
