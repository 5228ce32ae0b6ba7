"""Pathology (d): a Llama-derived architecture that re-encodes the whole sequence inside the model.

Unlike (c) ``llama_no_kv_cache``, the scheduler's view is left alone: every decode step is
scheduled as one new token per request with the rest cached (``input_tokens`` 1, context growing),
but the pipeline model feeds itself the whole sequence again and treats its KV cache as empty
(cache length 0), so each decode step is a full prefill (O(n^2) over a generation). The greedy
tokens stay those of the built-in Llama. Only what the model itself computes (its ragged input
tensor, its kernel time per step) shows the problem — the KV-cache rule reads both.

Built on the sibling package ``llama_custom``; single device, ``TextGenerationPipeline`` (CPU).
"""

from .arch import reencode_arch

ARCHITECTURES = [reencode_arch]
