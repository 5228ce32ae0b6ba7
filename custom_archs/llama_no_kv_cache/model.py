"""A Llama pipeline model that makes every step re-encode the whole sequence."""

from __future__ import annotations

from collections.abc import Sequence

from max.driver import Buffer
from max.nn.kv_cache import KVCacheInputs
from max.pipelines.architectures.llama3.model import Llama3Inputs, Llama3Model
from max.pipelines.context import TextContext
from max.pipelines.context.tokens import TokenBuffer


class ReencodingTokenBuffer(TokenBuffer):
    """A token buffer that forgets what was processed each time a token is added.

    ``advance_with_token`` normally leaves only the new token active (the rest is in the KV
    cache). Rewinding to position 0 makes MAX's KV-cache manager report a cache length of 0
    and schedule every token again: the whole sequence is re-encoded at the next step.
    """

    __slots__ = ()

    def advance_with_token(self, token: int) -> None:
        TokenBuffer.advance_with_token(self, token)
        self.rewind_processing(self.processed_length)


class NoKVCacheLlamaModel(Llama3Model):
    """Llama 3 whose requests never reuse their KV cache (see the package docstring)."""

    def prepare_initial_token_inputs(
        self,
        replica_batches: Sequence[Sequence[TextContext]],
        kv_cache_inputs: KVCacheInputs[Buffer, Buffer] | None = None,
        return_n_logits: int = 1,
    ) -> Llama3Inputs:
        # Contexts reach the model worker as plain TokenBuffers (in `max serve` they are
        # deserialized there); switch each one over the first time it is seen. The first step
        # is a real prefill; from the next token on, every step re-encodes everything.
        for batch in replica_batches:
            for ctx in batch:
                if type(ctx.tokens) is TokenBuffer:
                    ctx.tokens.__class__ = ReencodingTokenBuffer
        return super().prepare_initial_token_inputs(
            replica_batches, kv_cache_inputs=kv_cache_inputs, return_n_logits=return_n_logits
        )
