"""The local WikiText-2 task of lex_wikitext2.yaml: documents from the shared file, metrics as lm-eval's wikitext."""

import os
import re
from pathlib import Path

DEFAULT = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "wikitext-2" / "test.txt"


def load_wikitext2(path=None, **unused):
    """{"test": Dataset of {"page": article}}: the articles of WikiText-2's test file (metadata ``path``, else
    $LEX_WIKITEXT2, else ../shared/data/wikitext-2/test.txt), cut as ``lex prepare --documents wikitext`` cuts them."""
    import datasets

    from lex_plugin.data.prepare import split_wikitext

    path = Path(path or os.environ.get("LEX_WIKITEXT2") or DEFAULT)
    if not path.is_file():
        raise FileNotFoundError(f"no WikiText-2 test file at {path}: pass --metadata '{{\"path\": \"...\"}}' or set LEX_WIKITEXT2.")
    pages = split_wikitext(path.read_text(encoding="utf-8"))
    return datasets.DatasetDict({"test": datasets.Dataset.from_list([{"page": p} for p in pages])})


def process_results(doc, results):
    """lm-eval's wikitext metrics (words and bytes of the raw page) and the log-likelihood itself (nats)."""
    (loglikelihood,) = results
    words = len(re.split(r"\s+", doc["page"]))
    size = len(doc["page"].encode("utf-8"))
    return {"word_perplexity": (loglikelihood, words), "byte_perplexity": (loglikelihood, size),
            "bits_per_byte": (loglikelihood, size), "loglikelihood": loglikelihood}


def total(items):
    """Sum of the documents' log-likelihoods (nats)."""
    return float(sum(items))
