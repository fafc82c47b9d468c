"""lex_lm for Hugging Face transformers: what an exported model loads and nothing else. The config, the base
model and the causal LM (the package's attention core behind transformers' ``PreTrainedModel``,
``GenerationMixin`` and cache API), and the tokenizer that encodes as ``lex prepare`` does. These modules, and
the package modules they import, are the remote code of an export (``lex_plugin.export``, ``lex export-hf``):
they need torch, transformers, safetensors, sentencepiece and sacremoses, never fairseq or TorchScale.
"""

from .configuration import MODEL_TYPE, LexConfig
from .modeling import LexCache, LexForCausalLM, LexModel, attention_spec
from .tokenization import LexTokenizer, read_fairseq_dictionary

__all__ = ["LexCache", "LexConfig", "LexForCausalLM", "LexModel", "LexTokenizer", "MODEL_TYPE", "attention_spec",
           "read_fairseq_dictionary"]
