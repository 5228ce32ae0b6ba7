"""What a model folder says about the work of one decode step: selected ``config.json`` fields, and the stored
weights by role read from the safetensors headers (never the tensors themselves).

A safetensors file starts with an 8-byte little-endian header length and a JSON header that gives, per
tensor, its dtype, shape and byte range: the exact bytes a step must read, whatever the encoding (bf16,
FP8 with block or channel scales, packed FP4, biases). Equivalent manual check:
``python -c "from safetensors import safe_open; f = safe_open('model.safetensors', 'np'); print(f.keys())"``.
"""

from __future__ import annotations

import json
import math
import os
import re
import struct
from pathlib import Path
from typing import Any

from max_profile.model import ModelWeights, WeightGroup

CONFIG_KEYS = (
    "architectures",
    "model_type",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "torch_dtype",
    "dtype",
    "tie_word_embeddings",
    "num_local_experts",
    "num_experts",
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "shared_expert_intermediate_size",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "quantization_config",
)
"""config.json fields the analysis reads (a multimodal model's ``text_config`` wins over the top level)."""

MAX_HEADER_BYTES = 100 << 20
"""A safetensors header longer than this is not read (real headers are kilobytes to a few megabytes)."""

_ROLE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("lm_head", re.compile(r"(^|\.)(lm_head|output|embed_out)\.")),
    ("embedding", re.compile(r"(embed_tokens|word_embeddings|tok_embeddings|wte|embedding)\.")),
    ("shared_experts", re.compile(r"shared_experts?\.")),
    ("experts", re.compile(r"\.experts\.")),
)
"""Tensor roles by Hugging Face naming, first match wins; everything else is a per-layer weight (``layers``)."""


def read_model_config(model_path: str) -> dict[str, object] | None:
    """Selected fields of ``config.json`` (None when the folder has none or it is not JSON)."""
    try:
        with open(os.path.join(model_path, "config.json"), encoding="utf-8") as fh:
            raw = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(raw, dict):
        return None
    text_config = raw.get("text_config")
    cfg: dict[str, Any] = text_config if isinstance(text_config, dict) else raw
    out = {k: cfg[k] for k in CONFIG_KEYS if k in cfg}
    if "quantization_config" not in out and isinstance(raw.get("quantization_config"), dict):
        out["quantization_config"] = raw["quantization_config"]
    return out


def tensor_role(name: str) -> str:
    """``embedding``, ``lm_head``, ``experts`` (routed MoE experts), ``shared_experts`` or ``layers``."""
    return next((role for role, pattern in _ROLE_PATTERNS if pattern.search(name)), "layers")


def read_safetensors_header(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The JSON header of one safetensors file; ValueError when the file is not one."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise ValueError("shorter than a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if not 2 <= length <= MAX_HEADER_BYTES:
            raise ValueError(f"header length {length} out of range")
        text = fh.read(length)
    if len(text) != length:
        raise ValueError("truncated header")
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError("header is not a JSON object")
    return doc


def read_model_weights(model_path: str) -> ModelWeights | None:
    """Stored weight bytes and elements by role and by dtype, from every ``*.safetensors`` header in the folder.

    None when the folder has no safetensors file (GGUF, a hub id); a damaged header makes the whole inventory
    None (the analysis then estimates from config.json and says so).
    """
    files = sorted(Path(model_path).glob("*.safetensors")) if os.path.isdir(model_path) else []
    if not files:
        return None
    groups: dict[str, list[int]] = {}
    dtypes: dict[str, int] = {}
    names: set[str] = set()
    try:
        for path in files:
            for name, info in read_safetensors_header(path).items():
                if name == "__metadata__" or not isinstance(info, dict):
                    continue
                begin, end = info["data_offsets"]
                size = int(end) - int(begin)
                elements = math.prod(int(d) for d in info.get("shape", []))
                if size < 0 or elements < 0:
                    raise ValueError(f"tensor {name}: negative size")
                g = groups.setdefault(tensor_role(name), [0, 0, 0])
                g[0] += size
                g[1] += elements
                g[2] += 1
                dtype = str(info.get("dtype", "?"))
                dtypes[dtype] = dtypes.get(dtype, 0) + size
                names.add(name)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return ModelWeights(
            source=f"unreadable safetensors header ({type(exc).__name__}: {exc})",
            groups={},
            dtypes={},
            tied_embeddings=False,
        )
    return ModelWeights(
        source=f"safetensors headers ({len(files)} file{'s' if len(files) > 1 else ''})",
        groups={role: WeightGroup(bytes=v[0], elements=v[1], tensors=v[2]) for role, v in groups.items()},
        dtypes=dtypes,
        tied_embeddings="lm_head" not in groups,
    )
