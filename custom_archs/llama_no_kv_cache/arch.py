"""Registers the no-KV-cache Llama under its own name (never shadows a built-in)."""

from __future__ import annotations

import dataclasses

from llama_custom import llama_arch

from .model import NoKVCacheLlamaModel

no_kv_cache_arch = dataclasses.replace(
    llama_arch, name="MaxProfileNoKVCacheLlamaForCausalLM", example_repo_ids=[], pipeline_model=NoKVCacheLlamaModel
)
