"""Integrations with model libraries; each module imports its library lazily (none is a dependency).

* :mod:`flash_attn_hopper.integrations.transformers`: an attention implementation
  for Hugging Face transformers' ``AttentionInterface``.
"""
