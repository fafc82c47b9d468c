"""The model card (``README.md``) of a Hugging Face export: the metadata block the Hub reads, what the model is,
the attention it runs and how to change it, and its perplexity by length where a report was measured."""

import json
from pathlib import Path
from typing import List, Optional

__all__ = ["model_card", "model_index", "perplexity_table"]


def perplexity_table(report: dict) -> str:
    """A markdown table of an ``--eval-lengths`` report (``fairseq-eval-lm ... --report-json``): one row per
    window, one column per length, test perplexity in each cell (the stream protocol's rows; a report written with
    ``--fixed-target-tokens`` also holds that protocol's, which are left out).

    Raises:
        ValueError: a report without ``results`` rows of window, length and ppl.
    """
    rows = report.get("results")
    if not rows or not all({"window", "length", "ppl"} <= set(r) for r in rows):
        raise ValueError("the length report has no 'results' rows with window, length and ppl: give the JSON that "
                         "fairseq-eval-lm --eval-lengths ... --report-json writes.")
    rows = [r for r in rows if r.get("protocol", "stream") == "stream"]  # not --fixed-target-tokens' rows
    if not rows:
        raise ValueError("the length report has no stream rows (only --fixed-target-tokens ones): the card's table is "
                         "the stream protocol's perplexity.")
    lengths = sorted({r["length"] for r in rows})
    windows = list(dict.fromkeys(r["window"] for r in rows))
    cell = {(r["window"], r["length"]): r["ppl"] for r in rows}
    l = report.get("training_length")
    heads = [f"{n} ({n / l:g}l)" if l else str(n) for n in lengths]
    lines = ["| window | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(lengths)]
    for w in windows:
        lines.append(f"| {w} | " + " | ".join(f"{cell[w, n]:.2f}" if (w, n) in cell else "-" for n in lengths) + " |")
    return "\n".join(lines)


def _stream_rows(report: dict) -> list:
    """The report's stream-protocol rows (window, length, ppl), checked as :func:`perplexity_table` checks them."""
    perplexity_table(report)  # raises ValueError on a report without stream rows
    return [r for r in report["results"] if r.get("protocol", "stream") == "stream"]


def model_index(name: str, report: dict) -> List[str]:
    """The Hub's machine-readable evaluation results (the card's ``model-index`` metadata, YAML lines) of an
    ``--eval-lengths`` report: one perplexity metric per window and length of its stream rows, the same figures as
    :func:`perplexity_table`, on the report's split of its data-bin.

    Raises:
        ValueError: as :func:`perplexity_table`.
    """
    rows = _stream_rows(report)
    l = report.get("training_length")
    data = Path(str(report.get("data", "data-bin"))).name or "data-bin"
    split, tokens = report.get("split", "test"), report.get("split_tokens", "?")
    dataset = f"{data} ({split} split, {tokens} tokens)"
    lines = ["model-index:", f"- name: {json.dumps(name)}", "  results:", "  - task:", "      type: text-generation",
             "      name: Language modeling by evaluation length", "    dataset:", f"      type: {json.dumps(data)}",
             f"      name: {json.dumps(dataset)}", f"      split: {json.dumps(split)}", "    metrics:"]
    for r in rows:
        at = f"{r['length']} tokens ({r['length'] / l:g}l)" if l else f"{r['length']} tokens"
        metric = f"perplexity at {at}, {r['window']}"
        lines += ["    - type: perplexity", f"      value: {round(float(r['ppl']), 4)}", f"      name: {json.dumps(metric)}",
                  "      verified: false"]
    return lines


def model_card(config, spec: str, checkpoint: Path, report: Optional[Path], bpe: Optional[str] = "sentencepiece") -> str:
    """The text of ``README.md`` for an export of ``config`` (a ``LexConfig``) running ``spec`` by default,
    from ``checkpoint``; ``report``: an ``--eval-lengths`` JSON whose table the card shows, or None; ``bpe``: the
    data-bin's ``lex_prepare.json`` ``bpe`` (``"sentencepiece"``, or None for Moses words alone).

    Raises:
        ValueError: as :func:`perplexity_table`. FileNotFoundError: no ``report`` there.
    """
    l = config.training_length
    options = ", ".join(f"{k} = {v}" for k, v in sorted(config.position_options.items())) or "none"
    tags = ["lex_plugin", "fairseq", "length-extrapolation", config.pos_emb, "custom_code", "text-generation"]
    data = json.loads(Path(report).read_text(encoding="utf-8")) if report is not None else None
    name = Path(checkpoint).parent.name or "lex_lm"
    meta = "\n".join(["---", "library_name: transformers", "pipeline_tag: text-generation", "tags:",
                      *[f"- {t}" for t in dict.fromkeys(tags)], *(model_index(name, data) if data else []), "---"])
    if data is not None:
        measured = (f"Test perplexity by evaluation length ({data.get('split', 'test')} split, "
                    f"{data.get('split_tokens', '?')} tokens, measured with fairseq-eval-lm --eval-lengths):\n\n"
                    + perplexity_table(data))
    else:
        measured = ("Not measured for this export. Measure it with the plugin: `fairseq-eval-lm DATA --path CHECKPOINT "
                    "--user-dir lex_plugin --task lex_language_modeling --eval-lengths 256,1024,4096 --eval-windows "
                    "full,bca --report-json report.json`, then re-export with `--length-report report.json`.")
    return f"""{meta}

# {name}: a length-extrapolating language model (lex_plugin)

A decoder-only Transformer trained with lex_plugin (a fairseq plugin; TorchScale's layer layout),
exported from `{Path(checkpoint).name}` by `lex export-hf`. It loads with transformers alone: the attention code
is in this directory (the plugin's own modules, generated from its sources).

| | |
|---|---|
| position scheme | `{config.pos_emb}` ({options}) |
| training length l | {l} tokens |
| layers, width, heads | {config.num_hidden_layers}, {config.hidden_size}, {config.num_attention_heads} |
| vocabulary | {config.vocab_size} (fairseq dictionary; {"Moses + SentencePiece" if bpe == "sentencepiece" else "Moses words, no BPE"}, as `lex prepare` encoded the corpus) |
| default attention | `{spec}` |
| max_position_embeddings | {config.max_position_embeddings} |

## Use

```bash
pip install torch transformers safetensors sentencepiece sacremoses
```

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)
tok = AutoTokenizer.from_pretrained(DIR, trust_remote_code=True)
ids = tok("It was a dark and stormy night", return_tensors="pt").input_ids  # a prompt: no closing </s>
out = model.generate(ids, max_new_tokens=100, do_sample=False)
print(tok.decode(out[0, ids.size(1):]))
```

A text that ends with a line break ends its last paragraph with `</s>` (a document to score, as `lex prepare`
writes it); one that does not is a prompt to continue. `</s>` ends a paragraph, not a document: pass
`eos_token_id=None` to `generate()` to run past it.

## Attention

The default attention is `{spec}` (`attention` in `config.json`). Change it when loading, with the options of
the plugin's evaluation flags, e.g. blockwise causal attention (BCA, blocks of l/2), a sliding window of W
tokens, or ReRoPE:

```python
AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True, attention={{"mode": "bca"}})
AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True, attention={{"mode": "sliding", "sliding_window": 512}})
AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True, attention={{"mode": "rerope"}})
```

Under BCA and a sliding window the generation cache holds at most l (or W) positions however long the text.

`max_position_embeddings` ({config.max_position_embeddings}) is not a limit of the model: every position scheme
but a learned table runs at any length. It is the length tools such as lm-evaluation-harness feed at once (their
rolling window); set it (or lm-eval's `max_length`) to the length you want to evaluate.

## Perplexity by length

{measured}
"""
