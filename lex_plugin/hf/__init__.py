"""lex_lm for Hugging Face transformers: the config, the causal LM (the package's attention core behind
transformers' ``PreTrainedModel``, ``GenerationMixin`` and cache API), the tokenizer that encodes as
``lex prepare`` does, and the export of a fairseq checkpoint (``lex export-hf``, :mod:`.export`, which alone
needs fairseq). Needs ``transformers`` (the ``hf`` extra). Nothing here needs fairseq: an exported model loads
where fairseq is not installed (where it is, ``import lex_plugin`` still imports it, to register the plugin).
"""

from .configuration import MODEL_TYPE, LexConfig
from .modeling import LexCache, LexForCausalLM, attention_spec
from .tokenization import LexTokenizer, read_fairseq_dictionary

__all__ = ["LexCache", "LexConfig", "LexForCausalLM", "LexTokenizer", "MODEL_TYPE", "attention_spec", "read_fairseq_dictionary"]
