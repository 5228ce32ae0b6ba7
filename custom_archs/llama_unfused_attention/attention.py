"""Attention from generic graph ops over K/V gathered out of MAX's paged KV cache."""

from __future__ import annotations

from max.dtype import DType
from max.graph import DeviceRef, TensorValue, ops
from max.nn.attention import AttentionWithRope
from max.nn.kernels import (
    KEY_CACHE_INDEX,
    VALUE_CACHE_INDEX,
    kv_cache_gather_rows_ragged,
    store_k_cache_ragged,
    store_v_cache_ragged,
)
from max.nn.kv_cache.input_types import PagedCacheValues


def token_positions(
    input_row_offsets: TensorValue, cache_lengths: TensorValue, total_tokens: TensorValue
) -> TensorValue:
    """Absolute position of every ragged input token: its request's cache length + its index in the request."""
    device = input_row_offsets.device
    ones = ops.broadcast_to(ops.constant(1, DType.int64, device=device), total_tokens.shape)
    token = ops.cumsum(ones, axis=0) - 1  # [T]
    offsets = ops.cast(input_row_offsets, DType.int64)
    ends = offsets[1:]
    # request of each token: how many request ends lie at or before it
    request = ops.sum(ops.cast(ops.unsqueeze(token, 1) >= ops.unsqueeze(ends, 0), DType.int64), axis=1)
    request = ops.squeeze(request, 1)
    start = ops.gather(offsets, request, axis=0)
    cached = ops.gather(ops.cast(cache_lengths, DType.int64), request, axis=0)
    return cached + token - start


class UnfusedAttention(AttentionWithRope):
    """Same weights and names as :class:`AttentionWithRope`; attention as matmul / softmax / matmul.

    The KV cache is declared with one slot per token holding all KV heads
    (``n_kv_heads=1``, ``head_dim = kv_heads * head_dim``) so that
    ``kv_cache_gather_rows_ragged`` can read the history back.
    """

    def __call__(
        self,
        layer_idx: TensorValue,
        x: TensorValue,
        kv_collection: PagedCacheValues,
        freqs_cis: TensorValue,
        input_row_offsets: TensorValue,
    ) -> TensorValue:
        head_dim = self.kv_params.head_dim
        n_heads, n_kv = self.n_heads, self.num_key_value_heads
        group = n_heads // n_kv
        total = x.shape[0]
        qkv = self.qkv_proj(x)
        xq, xk, xv = ops.split(qkv, [n_heads * head_dim, n_kv * head_dim, n_kv * head_dim], axis=-1)

        pos = token_positions(input_row_offsets, kv_collection.cache_lengths, xq[:, 0])
        xq = self._rope(xq.reshape((-1, n_heads, head_dim)), pos, freqs_cis)
        xk = self._rope(xk.reshape((-1, n_kv, head_dim)), pos, freqs_cis)

        # One cache slot per token holds every KV head.
        store_k_cache_ragged(kv_collection, xk.reshape((-1, 1, n_kv * head_dim)), input_row_offsets, layer_idx)
        store_v_cache_ragged(kv_collection, xv.reshape((-1, 1, n_kv * head_dim)), input_row_offsets, layer_idx)

        # Every query row reads slots 0..n-1 of its request, n = longest sequence in the batch;
        # slots past the row's own position are clamped (valid pages) and masked.
        n_total = ops.cast(kv_collection.max_cache_length + kv_collection.max_prompt_length, DType.int64).reshape(())
        slot = ops.range(0, n_total, 1, out_dim="unfused_kv_len", dtype=DType.int64, device=DeviceRef.CPU()).to(
            x.device
        )
        visible = ops.unsqueeze(slot, 0) <= ops.unsqueeze(pos, 1)  # [T, n]
        slots = ops.cast(ops.min(ops.unsqueeze(slot, 0), ops.unsqueeze(pos, 1)), DType.int32)
        keys = kv_cache_gather_rows_ragged(
            kv_collection, slots, input_row_offsets, layer_idx, key_or_value=KEY_CACHE_INDEX
        )
        values = kv_cache_gather_rows_ragged(
            kv_collection, slots, input_row_offsets, layer_idx, key_or_value=VALUE_CACHE_INDEX
        )

        n = slots.shape[1]
        q = ops.cast(xq, DType.float32).reshape((total, n_kv, group, head_dim))
        k = ops.permute(
            ops.cast(keys, DType.float32).reshape((total, n, n_kv, head_dim)), [0, 2, 3, 1]
        )  # [T, kv, d, n]
        v = ops.permute(
            ops.cast(values, DType.float32).reshape((total, n, n_kv, head_dim)), [0, 2, 1, 3]
        )  # [T, kv, n, d]
        scores = ops.matmul(q, k) * self.scale  # [T, kv, g, n]
        # A large finite negative, not -inf: MAX 26.7's CPU fusion of where → softmax → matmul
        # produced NaN with -inf here.
        hidden = ops.constant(-1e30, DType.float32, device=x.device)
        scores = ops.where(ops.unsqueeze(ops.unsqueeze(visible, 1), 1), scores, hidden)
        probs = ops.softmax(scores, axis=-1)
        out = ops.matmul(probs, v)  # [T, kv, g, d]
        out = ops.cast(out.reshape((total, n_heads * head_dim)), x.dtype)
        return self.o_proj(out)

    def _rope(self, x: TensorValue, pos: TensorValue, freqs_cis: TensorValue) -> TensorValue:
        """RoPE from elementwise ops at explicit positions (MAX fuses this into its KV-store kernel)."""
        head_dim = x.shape[-1]
        freqs = ops.gather(ops.cast(freqs_cis, DType.float32).to(x.device), pos, axis=0)  # [T, d]
        freqs = ops.unsqueeze(freqs.reshape((-1, head_dim // 2, 2)), 1)  # [T, 1, d/2, 2]
        cos, sin = freqs[..., 0], freqs[..., 1]
        xf = ops.cast(x, DType.float32)
        if self.rope.interleaved:
            pairs = ops.as_interleaved_complex(xf)
            re, im = pairs[..., 0], pairs[..., 1]
        else:
            re, im = xf[..., : head_dim // 2], xf[..., head_dim // 2 :]
        out_re = re * cos - im * sin
        out_im = re * sin + im * cos
        if self.rope.interleaved:
            rotated = ops.stack([out_re, out_im], axis=-1).reshape(x.shape)
        else:
            rotated = ops.concat((out_re, out_im), axis=-1)
        return ops.cast(rotated, x.dtype)
