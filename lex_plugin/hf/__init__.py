"""lex_lm for Hugging Face transformers: the config, the causal LM (the package's attention core behind
transformers' ``PreTrainedModel``, ``GenerationMixin`` and cache API), the tokenizer that encodes as
``lex prepare`` does, and the export of a fairseq checkpoint (``lex export-hf``, :mod:`.export`, which alone
needs fairseq). Needs ``transformers`` (the ``hf`` extra); fairseq is not imported here.
"""

from .configuration import MODEL_TYPE, LexConfig
from .modeling import LexCache, LexForCausalLM, attention_spec
from .tokenization import LexTokenizer, read_fairseq_dictionary

__all__ = ["LexCache", "LexConfig", "LexForCausalLM", "LexTokenizer", "MODEL_TYPE", "attention_spec", "read_fairseq_dictionary"]
