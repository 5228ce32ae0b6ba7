"""A Llama pipeline model that re-encodes every sequence at every step, behind the scheduler's back."""

from __future__ import annotations

import gc
from collections.abc import Sequence
from typing import Any

from max.driver import Buffer
from max.nn.kv_cache import KVCacheInputs
from max.pipelines.architectures.llama3.model import Llama3Inputs, Llama3Model
from max.pipelines.context import TextContext


class ReencodingLlamaModel(Llama3Model):
    """Llama 3 whose every step recomputes the whole sequence (see the package docstring).

    For each step it rewinds each request's token window to position 0 (the whole sequence is
    active), asks the pipeline's KV-cache manager for cache inputs of that view (cache length 0,
    every page the sequence already owns), stages the tokens, and then puts the token windows back:
    the scheduler, the sampler and the KV manager's bookkeeping see a normal one-token decode.
    """

    _pipeline_kv_manager: Any = None

    def _kv_manager(self) -> Any:
        """The KV-cache manager of the pipeline that owns this model (the pipeline keeps it; the model is not told)."""
        if self._pipeline_kv_manager is None:
            for holder in gc.get_referrers(self):
                if isinstance(holder, dict) and holder.get("_pipeline_model") is self and "_kv_manager" in holder:
                    self._pipeline_kv_manager = holder["_kv_manager"]
                    break
        return self._pipeline_kv_manager

    def prepare_initial_token_inputs(
        self,
        replica_batches: Sequence[Sequence[TextContext]],
        kv_cache_inputs: KVCacheInputs[Buffer, Buffer] | None = None,
        return_n_logits: int = 1,
    ) -> Llama3Inputs:
        manager = self._kv_manager()
        rewound: list[tuple[TextContext, int]] = []
        if manager is not None:
            for batch in replica_batches:
                for ctx in batch:
                    cached = ctx.tokens.processed_length
                    if cached > 0:
                        ctx.tokens.rewind_processing(cached)
                        rewound.append((ctx, cached))
        try:
            if rewound:
                kv_cache_inputs = manager.runtime_inputs(replica_batches)
            return super().prepare_initial_token_inputs(
                replica_batches, kv_cache_inputs=kv_cache_inputs, return_n_logits=return_n_logits
            )
        finally:
            for ctx, cached in rewound:
                ctx.tokens.skip_processing(cached)
