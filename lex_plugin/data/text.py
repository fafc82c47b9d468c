"""Text as ``lex prepare`` reads it, for everything that encodes text at inference (the hub, the documents
scored by ``lex score``, the Hugging Face tokenizer): paragraphs, Moses tokenization, and the names of a
data-bin's files. Needs only sacremoses (imported when first used); the data-bin writing pipeline
(:mod:`.prepare`) builds on it.
"""

import re
from typing import List

__all__ = ["BPE_MODEL", "DICT_FILE", "META_FILE", "moses_tokenize", "paragraphs", "split_wikitext"]

META_FILE = "lex_prepare.json"  # how a data-bin's text was processed (Moses language, BPE)
DICT_FILE = "dict.txt"  # fairseq's dictionary
BPE_MODEL = "spm.model"  # the SentencePiece model, where the data-bin used BPE


def paragraphs(text: str) -> List[str]:
    """Blank-line separated blocks of ``text``, each with its whitespace collapsed to single spaces."""
    blocks, current = [], []
    for line in text.splitlines():
        if line.strip():
            current.append(line.strip())
        elif current:
            blocks.append(" ".join(" ".join(current).split()))
            current = []
    if current:
        blocks.append(" ".join(" ".join(current).split()))
    return blocks


_MOSES = {}


def _moses(lang: str):
    if lang not in _MOSES:
        from sacremoses import MosesPunctNormalizer, MosesTokenizer

        _MOSES[lang] = (MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang))
    return _MOSES[lang]


def moses_tokenize(text: str, lang: str = "en") -> str:
    """Moses punctuation normalisation + tokenisation through sacremoses' Python API, without XML
    escaping (the sacremoses CLI always escapes: ``&`` would become ``&amp;``)."""
    normalizer, tokenizer = _moses(lang)
    return tokenizer.tokenize(normalizer.normalize(text), escape=False, return_str=True)


_WIKITEXT_TITLE = re.compile(r"^ = [^=].* = $")


def split_wikitext(text: str) -> List[str]:
    """WikiText (raw or tokenized) articles: a new document at each top-level `` = Title = `` line."""
    docs, current = [], []
    for line in text.splitlines():
        if _WIKITEXT_TITLE.match(line) and any(l.strip() for l in current):
            docs.append("\n".join(current))
            current = []
        current.append(line)
    if any(l.strip() for l in current):
        docs.append("\n".join(current))
    return docs
