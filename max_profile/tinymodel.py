"""Build a random-weight Llama-architecture model in Hugging Face format, fully offline.

No hub and no torch: the safetensors file is written by hand (header + raw bytes; bf16 by
truncating float32), the tokenizer is a byte-level BPE trained locally with ``tokenizers``.
MAX runs float32 on the CPU and bfloat16 on GPUs (bf16 is GPU-only in MAX 26.7).

CLI: ``max-profile make-model DIR [--dtype float32|bfloat16] [--hidden 64] [--layers 2]``.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np

Dtype = Literal["float32", "bfloat16", "float8_e4m3fn"]
"""``float8_e4m3fn``: block-scaled FP8 as DeepSeek / Qwen3-FP8 checkpoints store it (``quant_method: fp8``,
``weight_block_size [128, 128]``, dynamic activation scales): the layers' projections in FP8 E4M3 with one float32
scale per 128x128 block (``<proj>.weight_scale``, the name MAX's Linear reads); embeddings, norms and lm_head in
bf16."""

FP8_BLOCK = 128


DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}<|begin_of_text|>{{ m['role'] }}: {{ m['content'] }}<|eot_id|>"
    "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}"
)

_TRAINING_TEXT = (
    "hello world. the quick brown fox jumps over the lazy dog. MAX runs models on cpu and gpu. "
    "profile prefill and decode phases. user assistant system message hello again world. "
    "kernels attention matmul norm rope sampling tokens per second latency throughput. "
) * 50


@dataclass(frozen=True)
class ModelShape:
    """Shape of the generated Llama model. The defaults are the CPU test shape."""

    hidden: int = 64
    layers: int = 2
    heads: int = 4
    kv_heads: int = 2
    intermediate: int | None = None
    vocab: int = 320
    max_positions: int = 2048
    extra_config: dict[str, object] = field(default_factory=dict)

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def intermediate_size(self) -> int:
        return self.intermediate if self.intermediate is not None else 2 * self.hidden

    def parameter_count(self, vocab: int) -> int:
        h, i, hd = self.hidden, self.intermediate_size, self.head_dim
        per_layer = h * self.heads * hd + 2 * h * self.kv_heads * hd + self.heads * hd * h + 3 * h * i + 2 * h
        return 2 * vocab * h + h + self.layers * per_layer


def _bf16_bytes(a: np.ndarray) -> bytes:
    """Round-to-nearest-even float32 -> bfloat16, as raw little-endian bytes."""
    u = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16).tobytes()


def _e4m3_table() -> tuple[np.ndarray, np.ndarray]:
    """Every finite FP8 E4M3 (fn) value, sorted, and its byte code (NaN codes 0x7F / 0xFF left out)."""
    codes = np.array([c for c in range(256) if c & 0x7F != 0x7F], dtype=np.uint8)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp = (codes >> 3) & 0xF
    man = (codes & 0x7).astype(np.float64)
    values = sign * np.where(exp == 0, man / 8.0 * 2.0**-6, (1.0 + man / 8.0) * 2.0 ** (exp.astype(np.float64) - 7))
    order = np.argsort(values, kind="stable")
    return values[order], codes[order]


def _e4m3_bytes(a: np.ndarray) -> bytes:
    """float32 -> FP8 E4M3 (fn) by nearest value (saturating at +-448), as raw bytes."""
    values, codes = _e4m3_table()
    x = np.clip(np.ascontiguousarray(a, dtype=np.float64).reshape(-1), values[0], values[-1])
    hi = np.clip(np.searchsorted(values, x), 1, values.size - 1)
    nearest = np.where(np.abs(values[hi - 1] - x) <= np.abs(values[hi] - x), hi - 1, hi)
    return codes[nearest].tobytes()


_ENCODERS: dict[str, tuple[int, Callable[[np.ndarray], bytes]]] = {
    "F32": (4, lambda a: np.ascontiguousarray(a, dtype=np.float32).tobytes()),
    "BF16": (2, _bf16_bytes),
    "F8_E4M3": (1, _e4m3_bytes),
}
"""safetensors dtype -> (bytes per element, encoder from float32)."""

TensorSpec = tuple[tuple[int, ...], Callable[[], np.ndarray]]
"""(shape, make): ``make`` returns float32 values, or a uint8 array already in the stored encoding (tiled FP8 codes)."""


def write_safetensors(
    path: Path, tensors: dict[str, TensorSpec], dtype: Dtype, *, stored: dict[str, str] | None = None
) -> None:
    """Write tensors as a safetensors file (8-byte header length, JSON header, raw data).

    Each tensor is (shape, make) and is generated only when written, so a multi-GB model never
    sits in memory at once. ``stored`` gives a tensor's safetensors dtype when it is not the model's
    (FP8 projections and their float32 scales).
    """
    default = "BF16" if dtype in ("bfloat16", "float8_e4m3fn") else "F32"
    kinds = {name: (stored or {}).get(name, default) for name in tensors}
    header: dict[str, object] = {}
    offset = 0
    for name, (shape, _) in tensors.items():
        nbytes = int(np.prod(shape)) * _ENCODERS[kinds[name]][0]
        header[name] = {"dtype": kinds[name], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header["__metadata__"] = {"format": "pt"}
    raw = json.dumps(header).encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)))
        fh.write(raw)
        for name, (shape, make) in tensors.items():
            values = make()
            encoded = values.dtype == np.uint8 and _ENCODERS[kinds[name]][0] == 1
            fh.write(
                values.tobytes()
                if encoded
                else _ENCODERS[kinds[name]][1](np.ascontiguousarray(values, dtype=np.float32).reshape(shape))
            )


def _train_tokenizer(out: Path, vocab_target: int, chat_template: str | None) -> tuple[int, dict[str, int]]:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)  # type: ignore[assignment]
    tok.decoder = decoders.ByteLevel()  # type: ignore[assignment]
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|pad|>"]
    trainer = trainers.BpeTrainer(  # type: ignore[call-arg]
        vocab_size=vocab_target,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_TRAINING_TEXT], trainer)
    bos = tok.token_to_id("<|begin_of_text|>")
    tok.post_processor = processors.TemplateProcessing(  # type: ignore[assignment]
        single="<|begin_of_text|> $A", pair="<|begin_of_text|> $A $B", special_tokens=[("<|begin_of_text|>", bos)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>", pad_token="<|pad|>"
    )
    if chat_template:
        fast.chat_template = chat_template
    fast.save_pretrained(str(out))
    ids = {s: int(tok.token_to_id(s)) for s in specials}
    return int(tok.get_vocab_size()), ids


def build_tiny_llama(
    out: str | os.PathLike[str],
    *,
    dtype: Dtype = "float32",
    shape: ModelShape | None = None,
    architecture: str = "LlamaForCausalLM",
    chat_template: str | None = DEFAULT_CHAT_TEMPLATE,
    seed: int = 0,
) -> Path:
    """Write a random-weight Llama model to ``out`` and return the folder.

    Files: config.json, generation_config.json, model.safetensors, tokenizer files and, when
    ``chat_template`` is given, chat_template.jinja (transformers 5 layout).
    """
    shape = shape or ModelShape()
    if shape.hidden % shape.heads or shape.heads % shape.kv_heads:
        raise ValueError(
            f"hidden ({shape.hidden}) must divide by heads ({shape.heads}) and heads by kv_heads ({shape.kv_heads})"
        )
    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    vocab, ids = _train_tokenizer(path, shape.vocab, chat_template)
    h, hd, inter = shape.hidden, shape.head_dim, shape.intermediate_size
    config: dict[str, object] = {
        "architectures": [architecture],
        "model_type": "llama",
        "hidden_size": h,
        "intermediate_size": inter,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": hd,
        "vocab_size": vocab,
        "max_position_embeddings": shape.max_positions,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "bos_token_id": ids["<|begin_of_text|>"],
        "eos_token_id": ids["<|eot_id|>"],
        "pad_token_id": ids["<|pad|>"],
        "torch_dtype": "bfloat16" if dtype == "float8_e4m3fn" else dtype,
        "attention_bias": False,
        "mlp_bias": False,
        "initializer_range": 0.02,
        **shape.extra_config,
    }
    if dtype == "float8_e4m3fn":
        config["quantization_config"] = {
            "quant_method": "fp8",
            "fmt": "e4m3",
            "activation_scheme": "dynamic",
            "weight_block_size": [FP8_BLOCK, FP8_BLOCK],
        }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    (path / "generation_config.json").write_text(json.dumps(gen, indent=2))

    rng = np.random.default_rng(seed)
    # Small models get fully random weights; big ones tile one random block (values do not
    # matter for profiling, and drawing billions of normals would take minutes).
    block = (rng.standard_normal(1 << 20, dtype=np.float32) * 0.02).astype(np.float32)

    def rand(*dims: int) -> TensorSpec:
        n = int(np.prod(dims))
        if n <= block.size:
            return dims, lambda: block[:n].copy()
        return dims, lambda: np.resize(block, n)

    def ones(n: int) -> TensorSpec:
        return (n,), lambda: np.ones(n, np.float32)

    tensors: dict[str, TensorSpec] = {
        "model.embed_tokens.weight": rand(vocab, h),
        "model.norm.weight": ones(h),
        "lm_head.weight": rand(vocab, h),
    }
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        tensors[p + "self_attn.q_proj.weight"] = rand(shape.heads * hd, h)
        tensors[p + "self_attn.k_proj.weight"] = rand(shape.kv_heads * hd, h)
        tensors[p + "self_attn.v_proj.weight"] = rand(shape.kv_heads * hd, h)
        tensors[p + "self_attn.o_proj.weight"] = rand(h, shape.heads * hd)
        tensors[p + "mlp.gate_proj.weight"] = rand(inter, h)
        tensors[p + "mlp.up_proj.weight"] = rand(inter, h)
        tensors[p + "mlp.down_proj.weight"] = rand(h, inter)
        tensors[p + "input_layernorm.weight"] = ones(h)
        tensors[p + "post_attention_layernorm.weight"] = ones(h)
    if shape.parameter_count(vocab) < 50_000_000:
        fresh = np.random.default_rng(seed + 1)

        def normal(dims: tuple[int, ...]) -> Callable[[], np.ndarray]:
            return lambda: (fresh.standard_normal(dims, dtype=np.float32) * 0.02).astype(np.float32)

        tensors = {
            name: ((dims, normal(dims)) if len(dims) == 2 else (dims, make)) for name, (dims, make) in tensors.items()
        }
    stored: dict[str, str] = {}
    if dtype == "float8_e4m3fn":
        codes = np.frombuffer(_e4m3_bytes(block), dtype=np.uint8)  # encoded once: big projections tile the codes

        def tiled_codes(n: int) -> Callable[[], np.ndarray]:
            return lambda: np.resize(codes, n)

        def unit_scales(dims: tuple[int, int]) -> Callable[[], np.ndarray]:
            return lambda: np.ones(dims, np.float32)

        for name in [n for n, (dims, _) in tensors.items() if n.startswith("model.layers.") and len(dims) == 2]:
            rows, cols = tensors[name][0]
            if rows * cols > block.size:
                tensors[name] = ((rows, cols), tiled_codes(rows * cols))
            scale = name.removesuffix(".weight") + ".weight_scale"
            blocks = (-(-rows // FP8_BLOCK), -(-cols // FP8_BLOCK))
            tensors[scale] = (blocks, unit_scales(blocks))
            stored[name], stored[scale] = "F8_E4M3", "F32"
    write_safetensors(path / "model.safetensors", tensors, dtype, stored=stored)
    (path / "max_profile_model.json").write_text(
        json.dumps({"builder": "max_profile.tinymodel", "dtype": dtype, "shape": asdict(shape), "seed": seed})
    )
    return path
