"""(a) A correct Llama-derived custom architecture: MAX 26.7's own Llama 3 under a name of its own.

What a user's bring-up package usually is: MAX's architecture imported and changed where it must be (here only the name,
so it never replaces the built-in ``LlamaForCausalLM``). Its graph is the built-in's, so it compiles to the same kernels
(and shares their compile-cache entries). The pathologies (b), (c), (d) build on it.
"""

from __future__ import annotations

import dataclasses

from max.pipelines.architectures.llama3.arch import llama_arch as _builtin_llama

llama_arch = dataclasses.replace(_builtin_llama, name="MaxProfileLlamaForCausalLM", example_repo_ids=[])

ARCHITECTURES = [llama_arch]
