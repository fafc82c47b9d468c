"""``LexTokenizer``: text to fairseq dictionary ids exactly as ``lex prepare`` and ``lex score`` encode it.

A text is cut into paragraphs (blank-line separated, whitespace collapsed: ``data.text.paragraphs``); each
is Moses-normalised and tokenized (sacremoses, no XML escaping: ``data.text.moses_tokenize``), split into
the corpus' SentencePiece pieces when the data-bin used BPE, mapped to ``dict.txt`` ids (fairseq's
``Dictionary``: ``<s>`` 0, ``<pad>`` 1, ``</s>`` 2, ``<unk>`` 3, then the file's symbols in order; a piece
not in it is ``<unk>``) and ended by ``</s>``, as ``lex prepare`` writes a file's paragraphs. The last paragraph
of a text is ended only when the text ends with a line break: a document (a file's text, ``"...\\n"``) is
encoded whole, a prompt to continue (``"It was a dark"``) stays open, so ``pipeline("text-generation")`` and
``tokenizer(prompt)`` continue the sentence as ``lex generate`` does. ``add_special_tokens`` (the default of
``tokenizer(text)``) puts ``</s>`` first: the start of a fairseq language-model stream, so
``tokenizer(doc).input_ids`` is the model input that scores ``doc`` as ``lex score`` does.

Decoding joins the pieces, detokenizes each paragraph with Moses and writes each ``</s>`` as the paragraph's end, a
blank line, so ``tokenizer(tokenizer.decode(ids))`` gives ``ids`` back for the ids of a text, and a lone ``</s>`` decodes
to ``"\\n\\n"``: the stop string lm-eval's ``generate_until`` takes from the end-of-text token (an empty one would end
every answer after its first token). With ``skip_special_tokens=True`` transformers drops the ``</s>`` first, and the
paragraphs run together.
"""

import os
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from transformers import PreTrainedTokenizer

from ..data.text import moses_tokenize, paragraphs

__all__ = ["FAIRSEQ_SPECIALS", "LexTokenizer", "ends_paragraph", "read_fairseq_dictionary"]

FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0..3 of every fairseq Dictionary
VOCAB_FILES_NAMES = {"dict_file": "dict.txt", "spm_file": "spm.model"}


def read_fairseq_dictionary(path: Path) -> List[str]:
    """The symbols of a fairseq ``dict.txt`` in id order, the 4 specials first, read as fairseq's
    ``Dictionary.add_from_file`` reads it: the lines ``readlines`` gives (universal newlines), trailing whitespace
    stripped, one ``symbol count [#fairseq:overwrite]`` per line split at its last space; a symbol listed again
    with ``#fairseq:overwrite`` takes a new id, which its encoding then uses (the earlier id still decodes to it).

    Raises:
        FileNotFoundError: no file there. ValueError: a line without an integer count, a symbol listed twice
            without ``#fairseq:overwrite``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no fairseq dictionary {path}: the export writes dict.txt beside the tokenizer; "
                                "copy it from the data-bin the model was trained on.")
    symbols = list(FAIRSEQ_SPECIALS)
    seen = set(symbols)
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for number, line in enumerate(lines, 1):
        fields = line.rstrip().rsplit(" ", 1)
        overwrite = len(fields) == 2 and fields[1] == "#fairseq:overwrite"
        if overwrite:
            fields = fields[0].rsplit(" ", 1)
        try:
            symbol, count = fields
            int(count)
        except ValueError:
            raise ValueError(f"{path}:{number}: expected 'symbol count [#fairseq:overwrite]', got {line!r}.") from None
        if symbol in seen and not overwrite:
            raise ValueError(f"{path}:{number}: duplicate symbol {symbol!r} (fairseq needs #fairseq:overwrite).")
        symbols.append(symbol)
        seen.add(symbol)
    return symbols


def ends_paragraph(text: str) -> bool:
    """Whether ``text`` ends its last paragraph: it ends with a line break (trailing spaces aside), as every
    paragraph of a file does."""
    return text.rstrip(" \t").endswith(("\n", "\r"))


class LexTokenizer(PreTrainedTokenizer):
    """The ``lex prepare`` encoding as a transformers tokenizer (module docstring).

    Args:
        dict_file: the data-bin's ``dict.txt``.
        spm_file: the data-bin's SentencePiece model, or None when it kept Moses words (``--bpe none``).
        moses_lang: the Moses language code (``lex_prepare.json``: ``lang``).
        bpe: ``sentencepiece`` when the data-bin used BPE (then ``spm_file`` is required), or None: SentencePiece
            exactly when ``spm_file`` is given (what the export writes and ``from_pretrained`` reads back).

    Raises:
        ValueError: no ``dict.txt``, or one :func:`read_fairseq_dictionary` refuses; ``bpe`` sentencepiece
            without its model file, or a SentencePiece file that does not exist.
    """

    vocab_files_names = VOCAB_FILES_NAMES
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, dict_file: Optional[str] = None, spm_file: Optional[str] = None, moses_lang: str = "en",
                 bpe: Optional[str] = None, **kwargs):
        # the files first, before transformers or SentencePiece is asked anything (ValueError: transformers
        # rewords an OSError into a message about other files)
        if dict_file is None or not Path(dict_file).is_file():
            raise ValueError("LexTokenizer needs dict.txt (the data-bin's fairseq dictionary): none was found "
                             "beside the tokenizer's files. Copy dict.txt from the data-bin, or re-export.")
        if bpe not in (None, "sentencepiece"):
            raise ValueError(f"LexTokenizer bpe must be 'sentencepiece' or None (Moses words), got {bpe!r}.")
        if bpe == "sentencepiece" and spm_file is None:
            raise ValueError("LexTokenizer needs spm.model (the data-bin's SentencePiece model; tokenizer_config.json "
                             "says bpe: sentencepiece): none was found beside the tokenizer's files. Copy spm.model "
                             "from the data-bin, or re-export.")
        if spm_file and not Path(spm_file).is_file():
            raise ValueError(f"no SentencePiece model {spm_file}; copy spm.model from the data-bin.")
        self.symbols = read_fairseq_dictionary(Path(dict_file))
        self.ids: Dict[str, int] = {s: i for i, s in enumerate(self.symbols)}
        self.dict_file, self.spm_file, self.moses_lang = str(dict_file), spm_file, moses_lang
        self.bpe = "sentencepiece" if spm_file else None
        self.sp = None
        if spm_file:
            import sentencepiece as spm

            self.sp = spm.SentencePieceProcessor(model_file=str(spm_file))
        kwargs.setdefault("split_special_tokens", True)  # '</s>' typed in a text is text, as lex prepare reads it
        kwargs.setdefault("clean_up_tokenization_spaces", False)
        for name, token in (("bos_token", "</s>"), ("eos_token", "</s>"), ("pad_token", "<pad>"), ("unk_token", "<unk>")):
            kwargs.setdefault(name, token)
        super().__init__(moses_lang=moses_lang, bpe=self.bpe, **kwargs)

    @property
    def vocab_size(self) -> int:
        """Symbols of ``dict.txt`` with fairseq's four specials: the model's output size."""
        return len(self.symbols)

    def get_vocab(self) -> Dict[str, int]:
        """Symbol -> fairseq dictionary id (a copy)."""
        return dict(self.ids)

    def _tokenize(self, text: str, **unused) -> List[str]:
        """Pieces of ``text``, ``</s>`` after each paragraph but an open last one (module docstring)."""
        pieces: List[str] = []
        for paragraph in paragraphs(text):
            tokenized = moses_tokenize(paragraph, self.moses_lang)
            if not tokenized.strip():
                continue
            pieces += self.sp.encode(tokenized, out_type=str) if self.sp is not None else tokenized.split()
            pieces.append(self.eos_token)
        if pieces and not ends_paragraph(text):
            pieces.pop()  # a prompt: its last paragraph goes on
        return pieces

    def _convert_token_to_id(self, token: str) -> int:
        return self.ids.get(token, self.ids["<unk>"])

    def _convert_id_to_token(self, index: int) -> str:
        return self.symbols[index]

    def convert_tokens_to_string(self, tokens: List[str]) -> str:
        """Pieces -> text: each paragraph's pieces joined and Moses-detokenized, each ``</s>`` a paragraph end (a
        blank line, ``"\\n\\n"``), so the text re-encodes to the same ids and a lone ``</s>`` is ``"\\n\\n"`` (the
        stop string lm-eval derives from the end-of-text token); ``<s>`` and ``<pad>`` dropped."""
        from sacremoses import MosesDetokenizer

        detok = MosesDetokenizer(lang=self.moses_lang)
        out, current = [], []

        def flush():
            if current:
                text = self.sp.decode_pieces(current) if self.sp is not None else " ".join(current)
                out.append(detok.detokenize(text.split()))
                current.clear()

        for token in tokens:
            if token == self.eos_token:
                flush()
                out.append("\n\n")
            elif token not in ("<s>", "<pad>"):
                current.append(token)
        flush()
        return "".join(out)

    def build_inputs_with_special_tokens(self, token_ids_0: List[int], token_ids_1: Optional[List[int]] = None) -> List[int]:
        """``</s>`` (the start of a fairseq LM stream) before the text's ids; a pair is refused."""
        if token_ids_1 is not None:
            raise ValueError("LexTokenizer encodes one text (a language-model stream), not a pair.")
        return [self.bos_token_id] + token_ids_0

    def get_special_tokens_mask(self, token_ids_0: List[int], token_ids_1: Optional[List[int]] = None,
                                already_has_special_tokens: bool = False) -> List[int]:
        """1 at the special tokens :meth:`build_inputs_with_special_tokens` adds, 0 at the text's (transformers' API)."""
        if already_has_special_tokens:
            return super().get_special_tokens_mask(token_ids_0, token_ids_1, True)
        return [1] + [0] * len(token_ids_0)

    def encode_prompt(self, text: str) -> List[int]:
        """Ids of a prompt to continue: ``</s>``, the text's ids, its last paragraph left open whether or not
        the text ends with a line break. A one-paragraph prompt gets ``lex generate``'s ids; a longer one keeps a
        ``</s>`` after each earlier paragraph, as ``lex prepare`` encodes text (``lex generate`` reads its prompt
        as one paragraph).

        Raises:
            ValueError: a text without a token.
        """
        ids = self.encode(text.rstrip(), add_special_tokens=False)
        if not ids:
            raise ValueError("empty prompt: give some text to continue.")
        return [self.bos_token_id] + ids

    def save_vocabulary(self, save_directory: str, filename_prefix: Optional[str] = None) -> Tuple[str, ...]:
        """Copy ``dict.txt`` (and ``spm.model``) into ``save_directory``."""
        import shutil

        prefix = f"{filename_prefix}-" if filename_prefix else ""
        written = []
        for source, name in ((self.dict_file, "dict.txt"), (self.spm_file, "spm.model")):
            if source:
                target = os.path.join(save_directory, prefix + name)
                if os.path.abspath(source) != os.path.abspath(target):
                    shutil.copyfile(source, target)
                written.append(target)
        return tuple(written)

