"""Integrations with other libraries. Each submodule imports its library only when imported itself:
`import flashattn.integrations.transformers` (Hugging Face Transformers)."""

__all__: list = []
