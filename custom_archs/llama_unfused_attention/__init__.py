"""Pathology (b): a Llama-derived architecture whose attention is built from generic ops.

Instead of MAX's fused attention (``flash_attention_ragged`` → ``mha`` kernels), each layer
applies RoPE with elementwise ops, writes K/V into the paged KV cache, gathers the whole K/V
history back out of it (``kv_cache_gather_rows_ragged``) and runs ``matmul`` → ``softmax`` →
``matmul`` with an explicit causal mask. The output is still right and the KV cache is used,
but attention is a chain of generic kernels that materializes the score matrix: what an
architecture ported without MAX's attention layers looks like to the profiler.

Built on the sibling package ``llama_custom`` (MAX puts the parent folder on ``sys.path``
when it imports ``--custom-architectures custom_archs/llama_unfused_attention``).
"""

from .arch import unfused_attention_arch

ARCHITECTURES = [unfused_attention_arch]
