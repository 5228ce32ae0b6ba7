"""A bytes-and-FLOPs model of one decode step, and where each kernel family sits against the GPU's two roofs.

One decode step reads every weight a token passes through once (dense layers, shared experts, the
output projection, the routed experts the batch selects), looks up one embedding row per request, and
reads the KV cache of every request; it computes 2 FLOPs per weight element per token plus attention's
4 FLOPs per head dimension per cached token. Weights count in the encoding they are stored in
(safetensors headers: bf16 2 bytes, FP8 1 byte plus its scales, packed FP4); the KV cache in the model's
activation dtype. The context tokens of a step are already summed over its requests.

``bytes / time`` and ``FLOPs / time`` against the GPU's datasheet peaks say how close each part runs to
its roofline. Equivalent manual check: ``ncu --metrics
dram__bytes.sum.per_second,sm__throughput.avg.pct_of_peak_sustained_elapsed``.
"""

from __future__ import annotations

import math
from typing import Any

from max_profile.model import DecodeCost, FamilyRoofline, ModelWeights

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

PEAK_DENSE_FLOPS: dict[str, dict[str, float]] = {
    "H200": {"bf16": 989e12, "fp8": 1979e12},
    "H100 SXM": {"bf16": 989e12, "fp8": 1979e12},
    "H100 PCIe": {"bf16": 756e12, "fp8": 1513e12},
    "H100": {"bf16": 989e12, "fp8": 1979e12},
    "GH200": {"bf16": 989e12, "fp8": 1979e12},
    "H20": {"bf16": 148e12, "fp8": 296e12},
    "B200": {"bf16": 2250e12, "fp8": 4500e12},
    "A100": {"bf16": 312e12},
    "L40S": {"bf16": 362e12, "fp8": 733e12},
    "L4": {"bf16": 121e12, "fp8": 242e12},
    "MI300X": {"bf16": 1307e12, "fp8": 2615e12},
    "MI325X": {"bf16": 1307e12, "fp8": 2615e12},
}
"""Datasheet dense tensor-core peaks (FLOP/s) by GPU name fragment and operand type (leads: an H200 here
measured 769-798 TFLOP/s on an 8192^3 bf16 product, 78-81 % of its 989)."""

ELEMENT_BYTES = {
    "float32": 4.0,
    "bfloat16": 2.0,
    "float16": 2.0,
    "float8_e4m3fn": 1.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "nvfp4": 0.5,
    "mxfp4": 0.5,
}
MATMUL_FAMILIES = ("gemv", "gemm", "grouped_matmul")
"""Families whose kernels read the weights (their time is what the weight bytes are measured against)."""


def _by_name(table: dict[str, Any], gpu_name: str | None) -> Any:
    if not gpu_name:
        return None
    upper = gpu_name.upper()
    hits = [(len(frag), value) for frag, value in table.items() if frag.upper() in upper]
    return max(hits, key=lambda h: h[0])[1] if hits else None


def peak_bandwidth(gpu_name: str | None) -> float | None:
    """Datasheet DRAM bandwidth (bytes/s) of a GPU named like ``NVIDIA H200``; None when unknown."""
    value = _by_name(PEAK_DRAM_BYTES_PER_S, gpu_name)
    return float(value) if value is not None else None


def peak_flops(gpu_name: str | None, operand: str) -> float | None:
    """Datasheet dense tensor-core FLOP/s for ``bf16`` or ``fp8`` operands; None when unknown."""
    table = _by_name(PEAK_DENSE_FLOPS, gpu_name)
    if table is None:
        return None
    return float(table.get(operand) or table.get("bf16") or 0) or None


def _i(cfg: dict[str, Any], *keys: str, default: int = 0) -> int:
    for key in keys:
        v = cfg.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return int(v)
    return default


def _quant(cfg: dict[str, Any]) -> dict[str, Any]:
    q = cfg.get("quantization_config")
    return q if isinstance(q, dict) else {}


def weight_operand(cfg: dict[str, Any], weights: ModelWeights | None) -> str:
    """``fp8`` when the matmul weights are stored as FP8 (safetensors ``F8_*`` or an FP8 quantization config), else
    ``bf16``."""
    if weights is not None and weights.dtypes:
        fp8 = sum(b for d, b in weights.dtypes.items() if d.startswith("F8"))
        if fp8 >= 0.5 * sum(weights.dtypes.values()):
            return "fp8"
        return "bf16"
    q = _quant(cfg)
    return (
        "fp8"
        if "fp8" in str(q.get("quant_method", "")).lower() or "fp8" in str(q.get("quant_algo", "")).lower()
        else "bf16"
    )


def activation_bytes(cfg: dict[str, Any]) -> float:
    """Bytes per element of activations and the KV cache: the model's torch dtype (bf16 when it names a low-bit
    type)."""
    name = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16")
    size = ELEMENT_BYTES.get(name, 2.0)
    return size if size >= 2 else 2.0


def _shape(cfg: dict[str, Any]) -> tuple[int, int, int, int, int, int]:
    """(hidden, layers, heads, kv heads, head dim, vocab) from config.json; zeros where missing."""
    h, layers, vocab = _i(cfg, "hidden_size"), _i(cfg, "num_hidden_layers"), _i(cfg, "vocab_size")
    heads = _i(cfg, "num_attention_heads", default=1)
    kv = _i(cfg, "num_key_value_heads", default=heads)
    hd = _i(cfg, "head_dim", default=h // heads if heads else 0)
    return h, layers, heads, kv, hd, vocab


def experts_active_fraction(cfg: dict[str, Any], batch: int) -> tuple[float, str]:
    """Expected share of routed experts a decode step of ``batch`` tokens reads: 1 - (1 - k/E)^batch
    (each token picks k of E; the batch reads the union). (1.0, why) when the config does not say."""
    experts = _i(cfg, "num_local_experts", "num_experts", "n_routed_experts")
    k = _i(cfg, "num_experts_per_tok")
    if not experts or not k:
        return 1.0, "routed experts counted whole (config.json gives no num_experts / num_experts_per_tok)"
    fraction = 1.0 - (1.0 - min(k, experts) / experts) ** max(batch, 1)
    return (
        fraction,
        f"{k} of {experts} routed experts per token: {fraction:.1%} of expert weights read at batch {batch}",
    )


def kv_bytes_per_token(cfg: dict[str, Any]) -> float | None:
    """KV-cache bytes per cached token over all layers (MLA: the compressed latent plus the RoPE part)."""
    h, layers, _heads, kv, hd, _vocab = _shape(cfg)
    if not (h and layers):
        return None
    size = activation_bytes(cfg)
    lora = _i(cfg, "kv_lora_rank")
    if lora:
        return layers * (lora + _i(cfg, "qk_rope_head_dim", default=64)) * size
    return 2.0 * layers * kv * hd * size


def _config_weights(cfg: dict[str, Any]) -> tuple[float, float, float, float, float, str] | None:
    """(dense bytes, dense elements, expert bytes, expert elements, output bytes, basis) estimated from config.json."""
    h, layers, heads, kv, hd, vocab = _shape(cfg)
    if not (h and layers and vocab):
        return None
    inter = _i(cfg, "intermediate_size", default=4 * h)
    attn = h * heads * hd + 2 * h * kv * hd + heads * hd * h
    experts = _i(cfg, "num_local_experts", "num_experts", "n_routed_experts")
    moe_inter = _i(cfg, "moe_intermediate_size", default=inter)
    shared = _i(cfg, "n_shared_experts") * 3 * h * moe_inter + (3 * h * _i(cfg, "shared_expert_intermediate_size"))
    dense_el = layers * (attn + (shared if experts else 3 * h * inter) + 2 * h)
    expert_el = layers * experts * 3 * h * moe_inter if experts else 0
    q = _quant(cfg)
    method = str(q.get("quant_method") or q.get("quant_algo") or "").lower()
    act = activation_bytes(cfg)
    if "fp8" in method:
        block = q.get("weight_block_size")
        scale = (
            4.0 / (block[0] * block[1])
            if isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)
            else 0.0
        )
        wbytes, basis = 1.0 + scale, f"config.json estimate: FP8 weights ({method}), 1 byte + scales"
    elif "fp4" in method or "mxfp4" in method:
        wbytes, basis = 0.5 + 1.0 / 16, f"config.json estimate: FP4 weights ({method}), half a byte + scales"
    else:
        wbytes = ELEMENT_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), 2.0)
        basis = f"config.json estimate: {wbytes:g}-byte weights"
    output_bytes = float(vocab * h * act)
    return dense_el * wbytes, float(dense_el), expert_el * wbytes, float(expert_el), output_bytes, basis


def _expert_share_per_token(cfg: dict[str, Any]) -> float:
    """k / E: the share of the routed experts' weights one token multiplies (1.0 when the config does not say)."""
    experts, k = _i(cfg, "num_local_experts", "num_experts", "n_routed_experts"), _i(cfg, "num_experts_per_tok")
    return min(k, experts) / experts if experts and k else 1.0


def decode_step_cost(
    cfg: dict[str, Any], weights: ModelWeights | None, batch: int, context_tokens: float
) -> dict[str, Any] | None:
    """Bytes and FLOPs of one decode step of ``batch`` requests whose cached contexts sum to ``context_tokens``
    (:func:`step_cost` with one new token per request)."""
    return step_cost(cfg, weights, batch=batch, context_tokens=context_tokens)


def step_cost(
    cfg: dict[str, Any],
    weights: ModelWeights | None,
    *,
    batch: int,
    context_tokens: float,
    new_tokens: float | None = None,
) -> dict[str, Any] | None:
    """Bytes and FLOPs of one step of ``batch`` requests that feed ``new_tokens`` tokens (default: one each, a decode
    step) over cached contexts summing to ``context_tokens``.

    A prefill step (``new_tokens`` > ``batch``) reads the weights once, multiplies every new token through the layers,
    computes logits for each request's last token only, attends causally (each new token over the cached context and
    the new tokens before it) and writes the new tokens' K/V. Keys: weight_bytes, kv_bytes, embedding_bytes,
    matmul_flops, attention_flops, basis (how the weights were counted), and the output projection's part of the weights
    and matmul FLOPs (output_bytes, output_flops). None when neither the weights nor config.json
    give the model's size.
    """
    h, layers, heads, _kv, hd, _vocab = _shape(cfg)
    batch = max(int(batch), 1)
    new = float(new_tokens) if new_tokens is not None and new_tokens > 0 else float(batch)
    fraction, experts_note = experts_active_fraction(cfg, max(int(round(new)), 1))
    act = activation_bytes(cfg)
    if weights is not None and weights.groups:
        g = weights.groups

        def grp(role: str) -> tuple[float, float]:
            w = g.get(role)
            return (float(w.bytes), float(w.elements)) if w else (0.0, 0.0)

        layers_b, layers_e = grp("layers")
        shared_b, shared_e = grp("shared_experts")
        expert_b, expert_e = grp("experts")
        emb_b, emb_e = grp("embedding")
        out_b, out_e = (emb_b, emb_e) if weights.tied_embeddings else grp("lm_head")
        dense_b, dense_e = layers_b + shared_b, layers_e + shared_e
        by_dtype = sorted(weights.dtypes.items(), key=lambda kv: -kv[1])
        basis = f"stored weights, {weights.source}: " + ", ".join(f"{d} {b / 1e9:.3g} GB" for d, b in by_dtype)
        emb_row = emb_b / emb_e * h if emb_e and h else h * act
    else:
        est = _config_weights(cfg)
        if est is None:
            return None
        dense_b, dense_e, expert_b, expert_e, out_b, basis = est
        out_e, emb_row = out_b / act, h * act
    if expert_b:
        basis += f"; {experts_note}"
    context = max(context_tokens, 0.0)
    per_request_new, per_request_cached = new / batch, context / batch
    # each new token attends over its request's cached context and the new tokens up to itself
    attended = (
        new * per_request_cached + batch * per_request_new * (per_request_new + 1) / 2 if new > batch else context
    )
    kv_tokens = context + (
        new if new > batch else 0.0
    )  # a prefill writes the new tokens' K/V; a decode's one token is noise
    return {
        "weight_bytes": dense_b + out_b + expert_b * fraction,
        "kv_bytes": (kv_bytes_per_token(cfg) or 0.0) * kv_tokens,
        "embedding_bytes": new * emb_row,
        "matmul_flops": 2.0 * (new * (dense_e + expert_e * _expert_share_per_token(cfg)) + batch * out_e),
        "attention_flops": 4.0 * layers * heads * hd * attended,
        "basis": basis,
        "output_bytes": out_b,
        "output_flops": 2.0 * batch * out_e,
    }


def _family_row(
    family: str,
    ms_per_step: float,
    bytes_per_step: float,
    flops_per_step: float,
    peak_bw: float | None,
    peak_fl: float | None,
) -> FamilyRoofline:
    s = ms_per_step / 1e3
    bw = bytes_per_step / s if s > 0 else None
    fl = flops_per_step / s if s > 0 else None
    return FamilyRoofline(
        family=family,
        ms_per_step=round(ms_per_step, 6),
        bytes_per_step=round(bytes_per_step),
        flops_per_step=round(flops_per_step),
        achieved_GBps=round(bw / 1e9, 1) if bw is not None else None,
        pct_of_peak_bandwidth=round(100.0 * bw / peak_bw, 1) if bw is not None and peak_bw else None,
        achieved_TFLOPs=round(fl / 1e12, 2) if fl is not None else None,
        pct_of_peak_compute=round(100.0 * fl / peak_fl, 1) if fl is not None and peak_fl else None,
    )


def decode_roofline(
    cfg: dict[str, Any],
    weights: ModelWeights | None,
    gpu_name: str | None,
    *,
    batch: int,
    context_tokens: float | None,
    step_ms: float,
    family_ms_per_step: dict[str, float] | None,
) -> DecodeCost | None:
    """The decode step's cost model against the GPU: the whole step (host step time and, with kernels, kernel
    time) and the families the model prices (matmuls: the weights; attention: the KV cache). ``context_tokens`` None:
    the steps carry no context lengths, so the KV cache's bytes are unknown (``kv_bytes`` None), never priced as zero;
    the whole step is then priced on its weights alone and attention is not priced."""
    cost = decode_step_cost(cfg, weights, batch, context_tokens or 0.0)
    if cost is None or not math.isfinite(step_ms) or step_ms <= 0:
        return None
    operand = weight_operand(cfg, weights)
    peak_bw, peak_fl = peak_bandwidth(gpu_name), peak_flops(gpu_name, operand)
    kv_known = context_tokens is not None
    total_bytes = cost["weight_bytes"] + (cost["kv_bytes"] if kv_known else 0.0) + cost["embedding_bytes"]
    total_flops = cost["matmul_flops"] + cost["attention_flops"]
    rows: list[FamilyRoofline] = []
    kernel_ms = None
    if family_ms_per_step:
        kernel_ms = sum(family_ms_per_step.values())
        matmul_ms = sum(family_ms_per_step.get(f, 0.0) for f in MATMUL_FAMILIES)
        if matmul_ms > 0:
            rows.append(
                _family_row(
                    "matmul (" + "+".join(f for f in MATMUL_FAMILIES if family_ms_per_step.get(f)) + ")",
                    matmul_ms,
                    cost["weight_bytes"],
                    cost["matmul_flops"],
                    peak_bw,
                    peak_fl,
                )
            )
        attention_ms = family_ms_per_step.get("attention", 0.0)
        if attention_ms > 0 and kv_known:
            rows.append(
                _family_row("attention", attention_ms, cost["kv_bytes"], cost["attention_flops"], peak_bw, peak_fl)
            )
    whole = _family_row("step (host time)", step_ms, total_bytes, total_flops, peak_bw, peak_fl)
    kernels = (
        _family_row("step (kernel time)", kernel_ms, total_bytes, total_flops, peak_bw, peak_fl) if kernel_ms else None
    )
    return DecodeCost(
        batch=batch,
        context_tokens=round(context_tokens, 1) if context_tokens is not None else None,
        weight_bytes=float(round(cost["weight_bytes"])),
        kv_bytes=float(round(cost["kv_bytes"])) if kv_known else None,
        embedding_bytes=float(round(cost["embedding_bytes"])),
        flops=float(round(total_flops)),
        weights_basis=cost["basis"],
        operand=operand,
        gpu=gpu_name,
        peak_bandwidth_GBps=round(peak_bw / 1e9, 1) if peak_bw else None,
        peak_TFLOPs=round(peak_fl / 1e12, 1) if peak_fl else None,
        step=whole,
        kernels=kernels,
        families=rows,
    )
