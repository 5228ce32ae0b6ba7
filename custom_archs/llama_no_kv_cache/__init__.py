"""Pathology (c): a Llama-derived architecture that ignores its KV cache.

After every generated token it rewinds the request to position 0, so MAX re-encodes the whole
sequence (prompt + everything generated so far) at every decode step: the output is still
right, but each step costs a prefill of the whole context (O(n^2) over a generation), decode
steps run prefill kernels (GEMM, prefill attention) and step time grows with the context.
This is what an architecture that does not use the KV cache looks like to the profiler.

Built on the sibling package ``llama_custom`` (MAX puts the parent folder on ``sys.path``
when it imports ``--custom-architectures custom_archs/llama_no_kv_cache``).
"""

from .arch import no_kv_cache_arch

ARCHITECTURES = [no_kv_cache_arch]
