"""Is this a local Hugging Face model folder? One check for every verb that loads a model."""

from __future__ import annotations

import os
import re
from pathlib import Path

from max_profile.errors import InputError

_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""owner/name, as on huggingface.co (no leading ./ or /, one slash)."""


def model_folder_problem(path: str | os.PathLike[str]) -> str | None:
    """None when ``path`` looks like a local HF model folder (config.json + weights), else what is wrong."""
    p = Path(path)
    if not p.exists():
        if _HUB_ID.fullmatch(str(path)):
            local = str(path).split("/")[1]
            return (
                f"model path {str(path)!r} does not exist here (a hub id? a local folder is needed: hf download "
                f"{path} --local-dir {local})"
            )
        return f"model path {str(p)!r} does not exist"
    if not p.is_dir():
        return f"model path {str(p)!r} is a file, not a model folder (expected config.json and weights)"
    if not (p / "config.json").is_file():
        return f"{str(p)!r} is not a model folder: it has no config.json"
    if not any(p.glob("*.safetensors")) and not any(p.glob("*.gguf")) and not any(p.glob("*.bin")):
        return f"{str(p)!r} is not a model folder: no *.safetensors / *.gguf weights in it"
    return None


def check_model_folder(path: str | os.PathLike[str]) -> None:
    """Raise :class:`InputError` when ``path`` is not a loadable model folder."""
    problem = model_folder_problem(path)
    if problem:
        raise InputError(problem)
