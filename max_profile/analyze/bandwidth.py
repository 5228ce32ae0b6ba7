"""Bytes a decode step must read (weights + KV cache) and the GPU's peak memory bandwidth.

Decode of a dense model is memory-bound: each step reads every weight once plus the KV cache
of every sequence. ``bytes / step time`` against the GPU's peak says how close decode is to
its roofline. Equivalent manual check: ``ncu --metrics dram__bytes.sum.per_second``.
"""

from __future__ import annotations

import json
import os
from typing import Any

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "fp8": 1, "int8": 1, "int4": 0.5, "nvfp4": 0.5}

PEAK_DRAM_BYTES_PER_S: dict[str, float] = {
    "H200": 4.8e12,
    "H100 SXM": 3.35e12,
    "H100 PCIe": 2.0e12,
    "H100 NVL": 3.9e12,
    "H100": 3.35e12,
    "H20": 4.0e12,
    "GH200": 4.0e12,
    "B200": 8.0e12,
    "B100": 8.0e12,
    "GB200": 8.0e12,
    "A100-SXM4-80GB": 2.039e12,
    "A100 80GB PCIe": 1.935e12,
    "A100": 1.555e12,
    "L40S": 0.864e12,
    "L4": 0.3e12,
    "A10G": 0.6e12,
    "MI300X": 5.3e12,
    "MI325X": 6.0e12,
    "MI355X": 8.0e12,
    "MI250X": 3.2e12,
}
"""Datasheet peak DRAM bandwidth by GPU name fragment (longest match wins)."""

_CONFIG_KEYS = (
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
    "num_experts_per_tok",
    "moe_intermediate_size",
    "quantization_config",
)


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
    return {k: cfg[k] for k in _CONFIG_KEYS if k in cfg}


def peak_bandwidth(gpu_name: str | None) -> float | None:
    if not gpu_name:
        return None
    best: tuple[int, float] | None = None
    upper = gpu_name.upper()
    for frag, bw in PEAK_DRAM_BYTES_PER_S.items():
        if frag.upper() in upper and (best is None or len(frag) > best[0]):
            best = (len(frag), bw)
    return best[1] if best else None


def _i(cfg: dict[str, Any], key: str, default: int = 0) -> int:
    v = cfg.get(key, default)
    return int(v) if isinstance(v, (int, float)) else default


def weight_bytes(cfg: dict[str, Any], dtype_bytes: float) -> float | None:
    """Bytes of weights one decode step reads (dense Llama-like; MoE counts active experts)."""
    h, layers, vocab = _i(cfg, "hidden_size"), _i(cfg, "num_hidden_layers"), _i(cfg, "vocab_size")
    if not (h and layers and vocab):
        return None
    heads = _i(cfg, "num_attention_heads", 1) or 1
    kv = _i(cfg, "num_key_value_heads", heads) or heads
    hd = _i(cfg, "head_dim", h // heads) or h // heads
    inter = _i(cfg, "intermediate_size", 4 * h)
    experts_active = _i(cfg, "num_experts_per_tok", 0)
    if experts_active:
        inter = _i(cfg, "moe_intermediate_size", inter) * experts_active
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    mlp = 3 * h * inter
    per_layer = attn + mlp + 2 * h
    params = layers * per_layer + vocab * h + h  # lm_head read in full; one embedding row is negligible
    return params * dtype_bytes


def kv_bytes_per_token(cfg: dict[str, Any], dtype_bytes: float) -> float | None:
    h, layers = _i(cfg, "hidden_size"), _i(cfg, "num_hidden_layers")
    if not (h and layers):
        return None
    heads = _i(cfg, "num_attention_heads", 1) or 1
    kv = _i(cfg, "num_key_value_heads", heads) or heads
    hd = _i(cfg, "head_dim", h // heads) or h // heads
    return 2.0 * layers * kv * hd * dtype_bytes


def dtype_bytes_of(cfg: dict[str, Any]) -> float:
    name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    return float(DTYPE_BYTES.get(name, 2))


def decode_step_bytes(cfg: dict[str, Any], context_tokens: float, batch: int = 1) -> float | None:
    """Bytes one decode step must read: all weights once + the KV cache of ``context_tokens`` (summed over the batch)."""
    db = dtype_bytes_of(cfg)
    w = weight_bytes(cfg, db)
    kv = kv_bytes_per_token(cfg, db)
    if w is None or kv is None:
        return None
    return w + kv * context_tokens
