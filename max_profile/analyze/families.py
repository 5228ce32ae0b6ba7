"""Kernel families: a table of name patterns, stable across GPU generations and MAX builds.

Names are normalized first (architecture prefixes such as ``sm90_`` / ``sm100_`` / ``gfx942_``,
hash suffixes, ``void``/template/parameter noise removed), then the first matching pattern in
:data:`FAMILY_PATTERNS` wins. Order matters: specific before generic. Unknown names fall in
``other`` and are listed in reports, never dropped.
"""

from __future__ import annotations

import re
from functools import lru_cache

FAMILIES: tuple[str, ...] = (
    "gemv",
    "gemm",
    "grouped_matmul",
    "attention",
    "norm",
    "rope",
    "activation",
    "elementwise",
    "quantize",
    "moe_routing",
    "gather_scatter",
    "collective",
    "memcpy",
    "sampling",
    "kv_cache",
    "other",
)

FAMILY_DESCRIPTIONS: dict[str, str] = {
    "gemv": "matrix-vector products (decode projections; memory-bound)",
    "gemm": "matrix-matrix products (prefill projections, batched decode; dense low-bit / block-scaled matmuls)",
    "grouped_matmul": "grouped matmuls (MoE experts: one launch over many weight matrices)",
    "attention": "fused attention (flash / MHA / MLA kernels)",
    "norm": "RMS / layer norm (often fused with the residual add)",
    "rope": "rotary position embedding",
    "activation": "activation functions (SiLU / GELU / SwiGLU)",
    "elementwise": "generic fused elementwise ops (MAX's mogg_foreach / elementwise)",
    "quantize": "dynamic activation quantization and scale layout",
    "moe_routing": "MoE top-k routing and index building",
    "gather_scatter": "gather / scatter / embedding lookups / concat",
    "collective": "allreduce / allgather / expert-parallel dispatch and combine",
    "memcpy": "memory copies and sets",
    "sampling": "token sampling (top-k / top-p) and logits processing",
    "kv_cache": "KV-cache stores and page management",
    "other": "not matched by any pattern",
}

# (family, regex) — searched in the normalized, lower-cased name, first match wins. ``^cijk_``: Tensile
# (rocBLAS / hipBLASLt) GEMMs; ``^nvjet_``: cuBLAS's JIT GEMMs on Hopper / Blackwell; ``rocclr_fill|copy``:
# the ROCm runtime's blit kernels behind hipMemset / hipMemcpy.
FAMILY_PATTERNS: tuple[tuple[str, str], ...] = (
    (
        "memcpy",
        r"^(memcpy|memset)|\b(memcpy|memset)\b|copy_(h|d)to(h|d)|\bdtod\b|\bhtod\b|\bdtoh\b|rocclr_(fill|copy)|"
        r"^(fill|copy)buffer",
    ),
    (
        "collective",
        r"allreduce|all_reduce|allgather|all_gather|reduce_scatter|reducescatter|nccl|rccl|ep_dispatch|ep_combine|"
        r"dispatch_kernel|combine_kernel|shmem|\bdispatch\b|\bcombine\b|broadcast_pull|multimem",
    ),
    (
        "sampling",
        r"topk_topp|top_k_top_p|topp_sampling|sampling|sample_|argmax|logits_processor|min_p|temperature|"
        r"rejection_sampler|logsoftmax_sampler|gumbel",
    ),
    (
        "moe_routing",
        r"moe_create_indices|moe_router|router|topk_route|topk_softmax|moe_align|route_|expert_ids|moe_.*indices|"
        r"^topk|_topk_",
    ),
    ("grouped_matmul", r"grouped|moe_matmul|expert.*matmul|bmm_grouped|group_gemm|ragged_matmul|fused_moe"),
    # dense low-bit matmuls (one weight matrix, not a group of experts): MAX's naive block-scaled FP8 fallback among
    # them
    ("gemm", r"fp8_quantization_naive|naive_blockwise_scaled|block_?(wise_)?scaled_?(fp8_)?(matmul|gemm|mm)"),
    (
        "quantize",
        r"quantize|quant_|block_scales|scale_layout|dequant|fp8_cast|to_fp8|nvfp4|mxfp4|scales_interleave|cast_to_f8|"
        r"fp8_quantization_+quant",
    ),
    (
        "attention",
        r"\bmha\b|_mha|mha_|\bmla\b|_mla|mla_|flash|attention|attn|fmha|decode_attn|paged_attention|mo\.mha|flare",
    ),
    ("rope", r"rope|rotary|freqs_cis"),
    ("norm", r"rms_norm|rmsnorm|layer_norm|layernorm|group_norm|\bnorm\b|_norm_|l2_norm"),
    ("gemv", r"gemv|matvec|split_k_reduce|splitk|gevm"),
    ("gemm", r"matmul|gemm|\bmm\b|cublas|cutlass|hipblaslt|wgmma|hgmma|tensorop|_mma_|\bmma\b|linear|^cijk_|^nvjet_"),
    ("kv_cache", r"kv_cache|kvcache|store_k|store_v|paged_kv|kv_store|cache_store|fused_qk_rope_store"),
    ("activation", r"silu|gelu|swiglu|swish|relu|sigmoid|tanh|softplus|mish"),
    ("gather_scatter", r"gather|scatter|embedding|index_select|concat|split|take_along|slice|transpose|permute"),
    (
        "elementwise",
        r"elementwise|foreach|mogg|epilogue|vectorized|unary|binary|broadcast|fill|iota|range|cast|add_|mul_|where|"
        r"softmax|reduce|algorithm_gpu|rowwise|arange|\bmo\.|composite\.",
    ),
)

_COMPILED: tuple[tuple[str, re.Pattern[str]], ...] = tuple((f, re.compile(p)) for f, p in FAMILY_PATTERNS)

SLOW_PATHS: tuple[tuple[str, str, str], ...] = (
    (
        "fp8_quantization_naive|naive_blockwise_scaled",
        "MAX's naive FP8 block-scaled matmul (a CUDA-core fallback, no tensor cores)",
        "MAX 26.7 takes this fallback for block-scaled FP8 weights its fast path does not cover on this GPU: try "
        "per-channel FP8 scales (a checkpoint without weight_block_size, or compressed-tensors channel scaling), bf16 "
        "weights (--quantization-encoding bfloat16 on a bf16 checkpoint), or a GPU with a block-scaled tensor-core "
        "path (sm100); report the GPU and scale layout to Modular",
    ),
    (
        r"(^|_)(naive|fallback|reference)(_|$)",
        "a naive fallback kernel",
        "MAX used a reference (naive / fallback) kernel here: another encoding or shape may hit a tuned kernel; "
        "report it to Modular",
    ),
)
"""Kernels that are known slow paths (regex on the normalized name, what it is, what to try): named in verdicts."""
_SLOW_COMPILED = tuple((re.compile(p), what, advice) for p, what, advice in SLOW_PATHS)


def slow_path(name: str) -> tuple[str, str] | None:
    """(what it is, what to try) when a kernel name is a known slow fallback (see :data:`SLOW_PATHS`), else None."""
    n = base_name(name).lower()
    return next(((what, advice) for pattern, what, advice in _SLOW_COMPILED if pattern.search(n)), None)


_ARCH_PREFIX = re.compile(r"^(sm_?\d{2,3}[a-z]?|gfx\d{3,4}[a-z]?|mi\d{3}[a-z]?|cdna\d|hopper|blackwell|ampere)_+", re.I)
_HASH_SUFFIX = re.compile(r"(_+[0-9a-f]{8,}|_+(?![a-z]+(?:[A-Z][a-z]+)+$)[A-Za-z0-9]{16,})$")
"""A hex or base-62 hash at the end; a camelCase word (``_fillBufferAligned``) is part of the name."""
_PARAMS = re.compile(
    r"\((?:[^()]*(?:\*|&|\bconst\b|\bint\b|\bfloat\b|\bunsigned\b|\bchar\b|\bdouble\b|\bbool\b|\blong\b|\bsize_t\b|"
    r"\bT\d\b|\bvoid\b)[^()]*)?\)\s*$"
)
_TEMPLATE = re.compile(r"<[^<>]*>")
_VOID = re.compile(r"^(void|__global__)\s+")


@lru_cache(maxsize=65536)
def base_name(name: str) -> str:
    """Kernel name without return type, parameter list, templates, arch prefix and hash suffix.

    ``void scale_kernel<float>(T1 *, T1, int)`` -> ``scale_kernel``;
    ``sm90_mha_depth128_bfloat16_..._9f3a2b1c0d4e5f60`` -> ``mha_depth128_bfloat16_...``.
    """
    n = name.strip()
    n = _VOID.sub("", n)
    n = _PARAMS.sub("", n)
    prev = None
    while prev != n:
        prev, n = n, _TEMPLATE.sub("", n)
    if "::" in n:
        n = n.rsplit("::", 1)[-1]
    n = _HASH_SUFFIX.sub("", n)
    n = _ARCH_PREFIX.sub("", n)
    return n or name


@lru_cache(maxsize=65536)
def classify_kernel(name: str) -> str:
    """The family of a kernel name (see :data:`FAMILY_PATTERNS`), ``other`` when none matches."""
    if name.startswith("_Z"):
        name = _demangle_light(name)
    n = base_name(name).lower()
    family = _first_family(n)
    if family is None and _GENERIC_BASE.match(n):
        # `cutlass::Kernel2<cutlass_80_tensorop_..._gemm_...>`, `gemvx::kernel<...>`: the name says nothing, the
        # namespace and template arguments do (only here: elsewhere template types such as cutlass::bfloat16_t mislead)
        family = _first_family(_PARAMS.sub("", _VOID.sub("", name.strip())).lower())
    return family or "other"


def _first_family(text: str) -> str | None:
    return next((family for family, pattern in _COMPILED if pattern.search(text)), None)


_GENERIC_BASE = re.compile(r"^(kernel\d*|device_kernel|global_kernel|kernel_impl)(\(.*\))?$")


def _demangle_light(mangled: str) -> str:
    """The identifiers of an Itanium-mangled name, in order (enough to classify it).

    ``_ZN2ns15rms_norm_kernelEv`` -> ``ns_rms_norm_kernel``.
    """
    words = []
    i, n = 2, len(mangled)
    while i < n:
        if mangled[i].isdigit():
            j = i
            while j < n and mangled[j].isdigit():
                j += 1
            length = int(mangled[i:j])
            words.append(mangled[j : j + length])
            i = j + length
        else:
            i += 1
    return "_".join(words) if words else mangled


def distinctive_regex(name: str) -> str:
    """A regex (for ``ncu -k regex:``) matching this kernel's family of builds but not its hash.

    ``gemv_split_k_bfloat16_bfloat16_bfloat16_128_<hash>`` -> ``gemv_split_k_bfloat16_bfloat16_bfloat16_128``.
    """
    return re.escape(base_name(name))
