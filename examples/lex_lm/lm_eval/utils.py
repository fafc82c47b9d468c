"""The local WikiText-2 task of lex_wikitext2.yaml: articles of the shared file, metrics as lm-eval's wikitext.

Runs where only an export's users' packages are installed (no lex_plugin): the articles are cut by the
repository's own ``lex_plugin/data/text.py``, loaded from this checkout by its path (it needs only the standard
library), so lm-eval and ``lex prepare --documents wikitext`` cut them alike.
"""

import importlib.util
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _text_module():
    spec = importlib.util.spec_from_file_location("lex_text", REPO / "lex_plugin" / "data" / "text.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def articles(dataset):
    """The file (one row, ``text``: ``sample_by: document``) -> one row per article (``page``)."""
    import datasets

    split = _text_module().split_wikitext
    return datasets.Dataset.from_list([{"page": page} for row in dataset for page in split(row["text"])])


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
