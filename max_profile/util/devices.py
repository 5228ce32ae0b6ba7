"""The ``--devices`` value: its forms, its default, and its check against what this machine has.

Forms (as ``max generate --devices``): ``cpu``, ``gpu`` (= ``gpu:0``), ``gpu:N``, ``gpu:N,M``, ``gpu:all``.
Default: ``gpu`` when a GPU is visible (NVML / ROCm SMI), else ``cpu``.
"""

from __future__ import annotations

from dataclasses import dataclass

from max_profile.errors import InputError

FORMS = "cpu, gpu, gpu:N, gpu:N,M or gpu:all"


@dataclass(frozen=True)
class DeviceChoice:
    text: str
    """The value as given (normalized to lower case): what MAX's --devices gets."""
    kind: str
    """``cpu`` or ``gpu``."""
    ids: tuple[int, ...] | None
    """GPU ordinals; None for ``cpu`` and for ``gpu:all``."""


def parse_devices(text: str) -> DeviceChoice:
    """Parse a ``--devices`` value; :class:`InputError` for anything else."""
    value = text.strip().lower()
    if value == "cpu":
        return DeviceChoice("cpu", "cpu", None)
    if value in ("gpu", "gpu:0"):
        return DeviceChoice(value, "gpu", (0,))
    if value == "gpu:all":
        return DeviceChoice(value, "gpu", None)
    if value.startswith("gpu:"):
        try:
            ids = tuple(int(i) for i in value[4:].split(","))
        except ValueError:
            ids = ()
        if ids and all(i >= 0 for i in ids):
            return DeviceChoice(value, "gpu", ids)
    raise InputError(f"unsupported --devices {text!r}: use {FORMS}")


def resolve_devices(requested: str | None, vendor: str) -> str:
    """The devices to run on: the request checked against this machine, or the default for it."""
    if not requested:
        return "gpu" if vendor in ("nvidia", "amd") else "cpu"
    choice = parse_devices(requested)
    if choice.kind == "gpu" and vendor not in ("nvidia", "amd"):
        raise InputError(
            f"unsupported device {requested!r}: no GPU is visible here (NVML / ROCm SMI found none); use --devices cpu"
        )
    return choice.text
