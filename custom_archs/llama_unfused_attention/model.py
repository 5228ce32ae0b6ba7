"""Llama 3 with :class:`UnfusedAttention` in every layer and a one-slot-per-token KV cache."""

from __future__ import annotations

import dataclasses
from typing import Any

from max.nn.attention import AttentionWithRope
from max.nn.kv_cache.cache_params import KVCacheParams
from max.pipelines.architectures.llama3.llama3 import Llama3
from max.pipelines.architectures.llama3.model import Llama3Model
from max.pipelines.architectures.llama3.model_config import Llama3Config
from max.pipelines.lib.graph_specs import GraphSpec

from .attention import UnfusedAttention


class UnfusedAttentionConfig(Llama3Config):
    """The KV cache holds one slot per token with all KV heads side by side."""

    @classmethod
    def construct_kv_params(cls, huggingface_config: Any, *args: Any, **kwargs: Any) -> KVCacheParams:
        params = super().construct_kv_params(huggingface_config, *args, **kwargs)
        return dataclasses.replace(params, n_kv_heads=1, head_dim=params.n_kv_heads * params.head_dim)


def per_head_kv_params(cache_params: KVCacheParams, n_kv_heads: int) -> KVCacheParams:
    """The per-head view of the one-slot cache: what the attention weights are shaped by."""
    return dataclasses.replace(cache_params, n_kv_heads=n_kv_heads, head_dim=cache_params.head_dim // n_kv_heads)


class UnfusedAttentionLlama3(Llama3):
    def __init__(self, config: Llama3Config) -> None:
        cache_params = config.kv_params
        assert isinstance(cache_params, KVCacheParams)
        super().__init__(
            dataclasses.replace(config, kv_params=per_head_kv_params(cache_params, config.num_key_value_heads))
        )
        for block in self.layers:
            # Same module and weights (built for the per-head view), generic-op forward.
            assert type(block.self_attn) is AttentionWithRope, type(block.self_attn)
            block.self_attn.__class__ = UnfusedAttention
        # Graph inputs follow the cache as MAX allocates it.
        self.config = config
        self.kv_params = cache_params


class UnfusedAttentionLlamaModel(Llama3Model):
    """Single-device only: builds :class:`UnfusedAttentionLlama3` for the decoder graph."""

    model_config_cls = UnfusedAttentionConfig
    config_class = UnfusedAttentionConfig

    def _create_model_config(self, state_dict: dict[str, Any]) -> Any:
        model_config = UnfusedAttentionConfig.initialize(self.pipeline_config, max_seq_len=self.max_seq_len)
        model_config.finalize(
            huggingface_config=self.huggingface_config,
            state_dict=state_dict,
            norm_method=self.norm_method,
            attention_bias=self.attention_bias,
            return_logits=self.return_logits,
            return_hidden_states=self.return_hidden_states,
        )
        return model_config

    def graph_specs(self, model_config: Any) -> dict[str, GraphSpec]:
        if len(self.devices) > 1 or model_config.data_parallel_degree > 1:
            raise ValueError("the unfused-attention example runs on one device")
        return super().graph_specs(model_config)

    def _single_device_spec(self, model_config: Llama3Config) -> GraphSpec:
        model = UnfusedAttentionLlama3(model_config)
        model.load_state_dict(self.state_dict, override_quantization_encoding=True, weight_alignment=1, strict=False)
        return GraphSpec(
            model, "llama3", self._bind_graph_inputs(model.input_tree(self.kv_params)), weights=model.state_dict()
        )
