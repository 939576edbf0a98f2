"""Integrations of flashport with other libraries; each submodule imports its library only when used.

- ``flashport.integrations.transformers``: ``register()`` makes ``attn_implementation="flashport"`` work in
  Hugging Face transformers models.
"""
