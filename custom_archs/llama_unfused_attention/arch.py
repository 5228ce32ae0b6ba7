"""Registers the unfused-attention Llama under its own name (never shadows a built-in)."""

from __future__ import annotations

import dataclasses

from llama_custom import llama_arch

from .model import UnfusedAttentionConfig, UnfusedAttentionLlamaModel

unfused_attention_arch = dataclasses.replace(
    llama_arch,
    name="MaxProfileUnfusedAttentionLlamaForCausalLM",
    example_repo_ids=[],
    pipeline_model=UnfusedAttentionLlamaModel,
    config=UnfusedAttentionConfig,
    multi_gpu_supported=False,
)
