"""Raw documents -> fairseq data-bin: Moses normalisation/tokenisation, SentencePiece BPE, fairseq-preprocess.

Input: a directory with one sub-directory per split (``train``, ``valid``, ``test``), each holding UTF-8
``.txt`` files: one document per file (the layout of ``shared/data/pg`` and PG-19), or with
``documents="wikitext"`` files whose articles start at top-level `` = Title = `` lines (WikiText-103 raw:
``train/wiki.train.raw.txt`` ...). Output: a fairseq data-bin (``{split}.bin/.idx``, ``dict.txt``), the BPE model
(``spm.model``) and ``lex_prepare.json`` describing how the text was processed (read back by the hub
interface to tokenize prompts the same way).

With ``like`` (``lex prepare SRC DEST --like DATA_BIN``) nothing is learned: the text goes through
DATA_BIN's Moses settings and ``spm.model`` and is binarised against its ``dict.txt``
(``fairseq-preprocess --srcdict``), so a model trained on DATA_BIN can score the new corpus; any subset of
the splits may be given (e.g. only ``test``).

Text layout handed to fairseq: one line per paragraph (blank-line separated block, internal line
breaks joined), so each paragraph ends with ``</s>``; one empty line between documents, so
``--sample-break-mode complete_doc`` sees document boundaries.
"""

import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from multiprocessing import Pool
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

from tqdm import tqdm

from .text import BPE_MODEL, DICT_FILE, META_FILE, moses_tokenize, paragraphs, split_wikitext

logger = logging.getLogger(__name__)

TEXT_SUFFIXES = (".txt", ".raw", ".tokens")  # .raw / .tokens: WikiText's own file names


class PrepareError(Exception):
    """Bad input to ``lex prepare``; the message says what to change. Nothing has been written."""


@dataclass
class PrepareConfig:
    """Options of :func:`prepare` (the ``lex prepare`` flags)."""

    splits: Sequence[str] = ("train", "valid", "test")
    lang: str = "en"
    bpe: str = "sentencepiece"  # or "none": keep Moses words
    vocab_size: int = 8192
    workers: int = max(1, min(os.cpu_count() or 1, 8))
    documents: str = "file"  # "file": one document per .txt; "wikitext": split files at " = Title = " lines
    max_docs: Optional[int] = None  # per split, for slices
    max_chars_per_doc: Optional[int] = None  # truncate documents, for slices
    spm_input_sentences: int = 2_000_000
    like: Optional[Path] = None  # a data-bin whose Moses settings, spm.model and dict.txt are reused


def load_like(data_bin: Path) -> dict:
    """The ``lex_prepare.json`` of a data-bin to prepare new text like, after checking that it holds
    what reuse needs (``dict.txt``, and ``spm.model`` when it used BPE).

    Raises:
        PrepareError: DATA_BIN is not a directory made by ``lex prepare``, or lacks one of those files.
    """
    data_bin = Path(data_bin)
    meta_file = data_bin / META_FILE
    if not meta_file.is_file():
        raise PrepareError(
            f"--like {data_bin}: no {META_FILE} there, so how its text was tokenized is unknown. Give a data-bin "
            "made by lex prepare (it writes lex_prepare.json, spm.model and dict.txt)."
        )
    meta = json.loads(meta_file.read_text())
    needed = [DICT_FILE] + ([meta.get("bpe_model") or BPE_MODEL] if meta.get("bpe") == "sentencepiece" else [])
    missing = [name for name in needed if not (data_bin / name).is_file()]
    if missing:
        raise PrepareError(
            f"--like {data_bin} lacks {', '.join(missing)}: the new text must be encoded with the very BPE model "
            "and dictionary the model was trained with. Copy them back from the original data-bin."
        )
    return meta


def read_split(split_dir: Path) -> List[Tuple[str, str]]:
    """(file name, text) of each text file (``TEXT_SUFFIXES``) in ``split_dir``, sorted by name.

    Raises:
        PrepareError: missing directory, no ``.txt`` file, a file that is not UTF-8, an empty file.
    """
    if not split_dir.is_dir():
        raise PrepareError(
            f"missing split: {split_dir} does not exist. Put the split's .txt documents there, "
            f"or choose the splits with --splits."
        )
    files = sorted(p for p in split_dir.iterdir() if p.suffix in TEXT_SUFFIXES and p.is_file())
    if not files:
        raise PrepareError(
            f"{split_dir} holds no text files ({', '.join(TEXT_SUFFIXES)}): one document per file, "
            "or WikiText files with --documents wikitext."
        )
    docs = []
    for path in files:
        raw = path.read_bytes()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise PrepareError(
                f"{path} is not UTF-8 (invalid byte 0x{raw[err.start]:02x} at offset {err.start}). "
                "Convert it, e.g. iconv -f latin1 -t utf-8."
            ) from None
        if not text.strip():
            raise PrepareError(f"{path} is empty; remove it or give it text.")
        docs.append((path.name, text.lstrip("\ufeff")))
    return docs


def split_documents(files: List[Tuple[str, str]], mode: str) -> List[Tuple[str, str]]:
    """(name, text) per document: the files themselves (``file``) or their WikiText articles (``wikitext``)."""
    if mode == "file":
        return files
    if mode == "wikitext":
        return [(f"{name}#{i}", doc) for name, text in files for i, doc in enumerate(split_wikitext(text))]
    raise PrepareError(f"--documents must be 'file' or 'wikitext', got {mode!r}.")


def _tokenize_document(job: Tuple[str, str, Optional[int]]) -> List[str]:
    text, lang, max_chars = job
    if max_chars is not None:
        text = text[:max_chars]
    return [tok for tok in (moses_tokenize(p, lang) for p in paragraphs(text)) if tok]


def tokenize_documents(docs: Sequence[Tuple[str, str]], cfg: PrepareConfig, desc: str) -> List[List[str]]:
    """Moses-tokenize each document's paragraphs, ``cfg.workers`` processes, with a progress bar."""
    jobs = [(text, cfg.lang, cfg.max_chars_per_doc) for _, text in docs]
    bar = dict(total=len(jobs), desc=desc, unit="doc", disable=None)
    if cfg.workers <= 1 or len(jobs) <= 1:
        return [_tokenize_document(j) for j in tqdm(jobs, **bar)]
    with Pool(min(cfg.workers, len(jobs))) as pool:
        return list(tqdm(pool.imap(_tokenize_document, jobs), **bar))


def write_text(path: Path, documents: Iterable[List[str]]) -> int:
    """One line per paragraph, an empty line between documents. Returns the number of lines written."""
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for i, lines in enumerate(documents):
            if i:
                f.write("\n")
            for line in lines:
                f.write(line + "\n")
                n += 1
    return n


def train_sentencepiece(text_file: Path, model_prefix: Path, cfg: PrepareConfig) -> None:
    """BPE model on the tokenized train split. fairseq adds its own specials, so SentencePiece keeps
    only <unk>.

    Raises:
        PrepareError: the vocabulary is too large for the corpus.
    """
    import sentencepiece as spm

    try:
        spm.SentencePieceTrainer.train(
            input=str(text_file),
            model_prefix=str(model_prefix),
            vocab_size=cfg.vocab_size,
            model_type="bpe",
            character_coverage=1.0,
            input_sentence_size=cfg.spm_input_sentences,
            shuffle_input_sentence=True,
            num_threads=max(1, cfg.workers),
            unk_id=0,
            bos_id=-1,
            eos_id=-1,
            pad_id=-1,
            minloglevel=2,
        )
    except RuntimeError as err:
        if "Vocabulary size" in str(err):
            raise PrepareError(f"--vocab-size {cfg.vocab_size} is too large for this corpus: {err}") from None
        raise


def encode_bpe(model_file: Path, documents: List[List[str]]) -> List[List[str]]:
    """Each paragraph as space-separated SentencePiece pieces."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(model_file))
    return [[" ".join(pieces) for pieces in sp.encode(lines, out_type=str)] if lines else [] for lines in documents]


def run_preprocess(
    text_files: Dict[str, Path], destdir: Path, cfg: PrepareConfig, log_file: Path, srcdict: Optional[Path] = None
) -> None:
    """``fairseq-preprocess --only-source`` on the text files (same interpreter, output to ``log_file``);
    with ``srcdict``, against that dictionary (``--srcdict``) instead of one built from the train text.

    Raises:
        PrepareError: fairseq-preprocess failed (its log is quoted).
    """
    cmd = [sys.executable, "-m", "fairseq_cli.preprocess", "--only-source", "--destdir", str(destdir)]
    cmd += ["--workers", str(max(1, cfg.workers))]
    for split, flag in (("train", "--trainpref"), ("valid", "--validpref"), ("test", "--testpref")):
        if split in text_files:
            cmd += [flag, str(text_files[split])]
    if srcdict is not None:
        cmd += ["--srcdict", str(srcdict)]
    elif cfg.bpe == "none":
        cmd += ["--nwordssrc", str(cfg.vocab_size)]
    with open(log_file, "w") as log:
        log.write(" ".join(cmd) + "\n")
        log.flush()
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = "".join(open(log_file).readlines()[-20:])
        raise PrepareError(f"fairseq-preprocess failed (exit {proc.returncode}):\n{tail}")


def prepare(src: Path, dest: Path, cfg: PrepareConfig, force: bool = False) -> dict:
    """Build a fairseq data-bin at ``dest`` from the documents under ``src`` (see the module docstring).

    Everything is written to a temporary sibling of ``dest`` and renamed into place at the end, so a
    failure leaves nothing half-written.

    Returns:
        The metadata written to ``dest/lex_prepare.json``.

    Raises:
        PrepareError: bad input (missing split, no documents, non-UTF-8 file, ``dest`` exists without
            ``force``, vocabulary too large, train split absent while BPE needs it, a ``like`` data-bin
            without ``lex_prepare.json``, ``dict.txt`` or its ``spm.model``).
    """
    src, dest = Path(src), Path(dest)
    like = load_like(cfg.like) if cfg.like is not None else None
    if like is not None:  # nothing is learned: the data-bin's settings replace the learning options
        cfg = replace(cfg, lang=like.get("lang", cfg.lang), bpe=like.get("bpe", cfg.bpe),
                      vocab_size=like.get("vocab_size", cfg.vocab_size))
    if cfg.bpe not in ("sentencepiece", "none"):
        raise PrepareError(f"--bpe must be 'sentencepiece' or 'none', got {cfg.bpe!r}.")
    if not cfg.splits:
        raise PrepareError("no split given: --splits takes some of train,valid,test.")
    if like is None and "train" not in cfg.splits:
        raise PrepareError(
            "the splits must include 'train' (the dictionary and the BPE are learned on it), or reuse another "
            "data-bin's with --like DATA_BIN."
        )
    unknown = [s for s in cfg.splits if s not in ("train", "valid", "test")]
    if unknown:
        raise PrepareError(f"unknown split(s) {unknown}; use train, valid, test.")
    if not src.is_dir():
        raise PrepareError(f"{src} is not a directory of splits ({', '.join(cfg.splits)}).")
    if dest.exists() and any(dest.iterdir()) and not force:
        raise PrepareError(f"{dest} already exists and is not empty; choose another --dest or pass --force.")

    docs = {  # read and validate every split before writing anything
        split: split_documents(read_split(src / split), cfg.documents)[: cfg.max_docs] for split in cfg.splits
    }
    dest.parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        work = stage / "text"
        work.mkdir()
        tokenized = {s: tokenize_documents(d, cfg, f"moses {s}") for s, d in docs.items()}
        meta = {
            "source": str(src.resolve()),
            "tokenizer": "moses",
            "lang": cfg.lang,
            "bpe": cfg.bpe,
            "bpe_model": BPE_MODEL if cfg.bpe == "sentencepiece" else None,
            "vocab_size": cfg.vocab_size,
            "max_chars_per_doc": cfg.max_chars_per_doc,
            "max_docs": cfg.max_docs,
            "documents": cfg.documents,
            "like": None if like is None else str(Path(cfg.like).resolve()),
            "splits": {},
        }
        if like is not None and cfg.bpe == "sentencepiece":
            shutil.copyfile(Path(cfg.like) / (like.get("bpe_model") or BPE_MODEL), stage / BPE_MODEL)
            tokenized = {
                s: encode_bpe(stage / BPE_MODEL, d) for s, d in tqdm(tokenized.items(), desc="bpe", disable=None)
            }
        elif cfg.bpe == "sentencepiece":
            write_text(work / "train.tok", tokenized["train"])
            logger.info("training SentencePiece BPE (vocabulary %d) on the train split", cfg.vocab_size)
            train_sentencepiece(work / "train.tok", stage / Path(BPE_MODEL).stem, cfg)
            tokenized = {
                s: encode_bpe(stage / BPE_MODEL, d) for s, d in tqdm(tokenized.items(), desc="bpe", disable=None)
            }
        text_files = {}
        for split, documents in tokenized.items():
            text_files[split] = work / f"{split}.txt"
            lines = write_text(text_files[split], documents)
            meta["splits"][split] = {
                "documents": len(documents),
                "lines": lines,
                "tokens": sum(len(line.split()) for d in documents for line in d),
            }
        srcdict = None if like is None else Path(cfg.like) / DICT_FILE
        run_preprocess(text_files, stage / "bin", cfg, stage / "preprocess.log", srcdict)
        for item in (stage / "bin").iterdir():
            item.replace(stage / item.name)
        (stage / "bin").rmdir()
        shutil.rmtree(work)
        with open(stage / META_FILE, "w") as f:
            json.dump(meta, f, indent=2)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(stage, 0o777 & ~umask)  # mkdtemp makes 0700 directories
        if dest.exists():
            shutil.rmtree(dest)
        stage.replace(dest)
        return meta
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
