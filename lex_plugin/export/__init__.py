"""Exports of a trained lex_lm to other ecosystems: :mod:`.hf` (``lex export-hf``: a Hugging Face model
directory), :mod:`.remote_code` (the self-contained code that directory carries, generated from this package's
sources) and :mod:`.model_card` (its README)."""
