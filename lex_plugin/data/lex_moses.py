"""``lex_moses``: fairseq tokenizer that undoes/redoes exactly what ``lex prepare`` did to the text.

fairseq's own ``moses`` tokenizer skips the punctuation normaliser that ``lex prepare`` applies, so
prompts would be tokenized differently from the training data. This one normalises, tokenizes without
XML escaping (encode) and detokenizes (decode), through sacremoses' Python API.
"""

from dataclasses import dataclass, field

from fairseq.data.encoders import register_tokenizer
from fairseq.dataclass import FairseqDataclass

from .text import moses_tokenize


@dataclass
class LexMosesConfig(FairseqDataclass):
    """``--tokenizer lex_moses`` options (from the data-bin's lex_prepare.json)."""

    moses_lang: str = field(default="en", metadata={"help": "Moses language code (lex_prepare.json: lang)"})


@register_tokenizer("lex_moses", dataclass=LexMosesConfig)
class LexMosesTokenizer:
    """encode: normalise + tokenize (no escaping); decode: detokenize. Strings in, strings out."""

    def __init__(self, cfg: LexMosesConfig):
        from sacremoses import MosesDetokenizer

        self.lang = cfg.moses_lang
        self.detok = MosesDetokenizer(lang=cfg.moses_lang)

    def encode(self, x: str) -> str:
        """Raw text -> space-separated Moses tokens, normalised as ``lex prepare`` did."""
        return moses_tokenize(x, self.lang)

    def decode(self, x: str) -> str:
        """Space-separated Moses tokens -> detokenized text."""
        return self.detok.detokenize(x.split())
