"""Registers the re-encoding Llama under its own name (never shadows a built-in)."""

from __future__ import annotations

import dataclasses

from llama_custom import llama_arch

from .model import ReencodingLlamaModel

reencode_arch = dataclasses.replace(
    llama_arch, name="MaxProfileReencodeLlamaForCausalLM", example_repo_ids=[], pipeline_model=ReencodingLlamaModel
)
