"""The model card (``README.md``) of a Hugging Face export: the metadata block the Hub reads, what the model is,
the attention it runs and how to change it, and the figures of the reports given, each with the record of how it
was measured.

The figures are read from the reports as every table of the project reads them (:mod:`lex_plugin.evaluation.figures`):

======================  ==========================================================================================
report                  figures (one per attention setting and length)
======================  ==========================================================================================
length (eval-lm)        test perplexity of the stream protocol; LongPPL where the report has it (``--longppl``)
passkey                 the fraction of prompts whose key ranks first; the fraction whose key greedy decoding writes
RULER-lite              the mean over its tasks (ranking)
BABILong-lite           the greedy accuracy, averaged over the tasks that fitted the length
======================  ==========================================================================================

The card shows them as tables, each followed by its report's provenance (command, commit, device, wall time), writes
the same figures into the Hub's machine-readable ``model-index`` metadata (``huggingface_hub.EvalResult``, the probe
named as the dataset's configuration) and judges them against the project's
definitions (:mod:`lex_plugin.experiments.definitions`).
"""

import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from ..evaluation.figures import attention_mode, babilong_greedy, mode_rows, passkey_rates, report_kind, ruler_mean
from ..experiments.benchmark import markdown_table
from ..experiments.benchmark_tables import provenance_line
from ..experiments.definitions import FAR_CONTEXT, FLAT, RETRIEVES, RETRIEVES_RANKED, RULER

__all__ = ["CardReport", "Figure", "eval_results", "figures", "measured", "model_card"]

# what each kind of report is called in the card, and the task its results are filed under in model-index
TITLES = {"length": "Perplexity by length", "longppl": "LongPPL by length", "passkey": "Passkey retrieval",
          "ruler": "RULER-lite", "babilong": "BABILong-lite"}


@dataclass(frozen=True)
class CardReport:
    """A report the card reads: ``path``, its JSON ``data`` and its ``kind`` (``"length"``: its perplexity and, where
    it has them, its LongPPL figures; ``"longppl"``: an eval-lm ``--longppl`` report read for its LongPPL alone;
    ``"passkey"``, ``"ruler"``, ``"babilong"``: a ``lex`` probe's ``--json``)."""

    path: Path
    kind: str
    data: dict

    @classmethod
    def read(cls, path: Path, probe: bool) -> "CardReport":
        """The report at ``path``, given as ``--length-report`` (``probe`` False) or ``--probe-report`` (True).

        Raises:
            FileNotFoundError: no file at ``path``. ValueError: not JSON; a report of no known kind
            (:func:`~lex_plugin.evaluation.figures.report_kind`); a probe's report given as the length report; a length
            report without LongPPL given as a probe's; a length report without stream rows (``--fixed-target-tokens``
            alone).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no report {path}: give the JSON of fairseq-eval-lm --report-json or of lex "
                                    "passkey, ruler or babilong --json.")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path} is not JSON ({err}): give a report's JSON.") from None
        try:
            kind = report_kind(data)
        except ValueError as err:
            raise ValueError(f"{path}: {err}") from None
        if not probe and kind != "length":
            raise ValueError(f"{path} is a {TITLES[kind]} report, not an --eval-lengths one: give it as "
                             "--probe-report.")
        if probe and kind == "length":
            if not any(r.get("longppl") for r in data["results"]):
                raise ValueError(f"{path} is a perplexity report without LongPPL: give it as --length-report (a "
                                 "--probe-report is a passkey, RULER-lite, BABILong-lite or --longppl report).")
            kind = "longppl"
        if kind == "length" and not any(r.get("protocol", "stream") == "stream" for r in data["results"]):
            raise ValueError(f"{path} has no stream rows (only --fixed-target-tokens ones): the card's table is the "
                             "stream protocol's perplexity; measure it without --fixed-target-tokens.")
        return cls(path, kind, data)

    @property
    def training_length(self) -> Optional[int]:
        """The l the report was measured at (None where it does not say)."""
        l = self.data.get("training_length")
        return int(l) if l else None


@dataclass(frozen=True)
class Figure:
    """One figure of a report: ``value`` (a perplexity, or a fraction of prompts in [0, 1]) of ``metric`` (the
    model-index metric type: ``perplexity``, ``longppl`` or ``accuracy``; ``what`` says which, in words, ``detail``
    how many prompts it counts) under the attention setting ``window`` at ``length`` tokens."""

    kind: str
    metric: str
    what: str
    window: str
    length: int
    value: float
    detail: str = ""

    @property
    def label(self) -> str:
        """``what`` with its ``detail`` in parentheses: how the card names the figure."""
        return f"{self.what} ({self.detail})" if self.detail else self.what


def _lengths_and_modes(data: dict) -> Tuple[List[int], List[str]]:
    """The lengths (ascending) and attention settings (in report order) of a probe report's rows."""
    rows = data["results"]
    return sorted({int(r["length"]) for r in rows}), list(dict.fromkeys(attention_mode(r) for r in rows))


def figures(report: CardReport) -> List[Figure]:
    """The figures of ``report`` (:class:`Figure`), read as every table of the project reads them
    (:mod:`lex_plugin.evaluation.figures`), by window then length."""
    data, out = report.data, []
    if report.kind in ("length", "longppl"):
        rows = [r for r in data["results"] if r.get("protocol", "stream") == "stream"]
        evaluator = (data.get("longppl") or {}).get("evaluator", "an unrecorded evaluator")
        if report.kind == "length":
            out += [Figure("length", "perplexity", "test perplexity", r["window"], int(r["length"]), float(r["ppl"]))
                    for r in rows]
        return out + [Figure("longppl", "longppl", f"LongPPL on the key tokens of {evaluator}", r["window"],
                             int(r["length"]), float(r["longppl"])) for r in rows if r.get("longppl")]
    lengths, modes = _lengths_and_modes(data)
    for mode in modes:
        for n in lengths:
            if report.kind == "passkey":
                ranked, greedy = passkey_rates([data], n, mode)
                if ranked is not None:
                    trials = sum(r["trials"] for r in mode_rows(data, mode)[n])
                    among = {r.get("distractors", 9) + 1 for r in mode_rows(data, mode)[n]}
                    among = "/".join(map(str, sorted(among)))
                    out.append(Figure("passkey", "accuracy", f"passkey ranked first among {among}", mode, n, ranked,
                                      f"{trials} prompts"))
                    out.append(Figure("passkey", "accuracy", "greedy passkey written whole", mode, n, greedy,
                                      f"{trials} prompts"))
            elif report.kind == "ruler":
                value = ruler_mean(data, n, mode)
                if value is not None:
                    out.append(Figure("ruler", "accuracy", "RULER-lite mean of the tasks scored at every length from "
                                      "l (ranking)", mode, n, value))
            else:
                value = babilong_greedy(data).get(mode, {}).get(n)
                if value is not None:
                    out.append(Figure("babilong", "accuracy", "BABILong-lite greedy accuracy (mean over the tasks that "
                                      "fit)", mode, n, value))
    return out


def _at(n: int, l: Optional[int]) -> str:
    return f"{n} tokens ({n / l:g}l)" if l else f"{n} tokens"


def measured(reports: Sequence[CardReport]) -> List[Tuple[CardReport, List[Figure]]]:
    """Each report with its figures (:func:`figures`), no figure given by two reports.

    Raises:
        ValueError: two reports give the same figure under the same window at the same length (which one would the
            card show?).
    """
    seen: Dict[tuple, Path] = {}
    out = []
    for report in reports:
        found = figures(report)
        for f in found:
            key = (f.what, f.window, f.length)
            if key in seen:
                raise ValueError(f"{seen[key]} and {report.path} both give {f.what} under {f.window} at {f.length} "
                                 "tokens: give one report per figure.")
            seen[key] = report.path
        out.append((report, found))
    return out


def eval_results(found: Sequence[Tuple[CardReport, List[Figure]]]) -> list:
    """The Hub's machine-readable evaluation results (``huggingface_hub.EvalResult``, the card's ``model-index``) of
    the reports' figures (:func:`measured`): one metric per :class:`Figure` (its value rounded to 4 decimals), on the
    report's split of its data-bin, the probe named as the dataset's configuration (``stream``: perplexity and LongPPL
    by length; ``passkey``, ``ruler-lite``, ``babilong-lite``: prompts built from that split).
    """
    from huggingface_hub import EvalResult

    config = {"length": "stream", "longppl": "stream", "passkey": "passkey", "ruler": "ruler-lite",
              "babilong": "babilong-lite"}
    task = {"length": "Language modeling by evaluation length", "longppl": "Language modeling by evaluation length",
            "passkey": "Passkey retrieval", "ruler": "RULER-lite", "babilong": "BABILong-lite"}
    out = []
    for report, figures_ in found:
        data, l = report.data, report.training_length
        bin_name = Path(str(data.get("data", "data-bin"))).name or "data-bin"
        split = data.get("split", "test")
        tokens = f", {data['split_tokens']} tokens" if data.get("split_tokens") else ""
        for f in figures_:
            out.append(EvalResult(task_type="text-generation", task_name=task[f.kind], dataset_type=bin_name,
                                  dataset_name=f"{bin_name} ({split} split{tokens})", dataset_config=config[f.kind],
                                  dataset_split=split, metric_type=f.metric, metric_value=round(f.value, 4),
                                  metric_name=f"{f.label} at {_at(f.length, l)}, {f.window}", verified=False))
    return out


def _table(found: Sequence[Figure], l: Optional[int]) -> str:
    """Rows window, columns length (``N (Kl)``), each figure's value at 2 decimals ("-" where none)."""
    lengths = sorted({f.length for f in found})
    cell = {(f.window, f.length): f"{f.value:.2f}" for f in found}
    return markdown_table(["window", *(f"{n} ({n / l:g}l)" if l else str(n) for n in lengths)],
                          [[w, *(cell.get((w, n), "-") for n in lengths)] for w in dict.fromkeys(f.window for f in found)])


def _named_checkpoint(report: CardReport) -> Optional[str]:
    """The checkpoint ``report`` measured: its ``checkpoint`` field (a probe's), else the ``--path`` of the command
    its provenance records (an eval-lm report's); None where neither says."""
    if report.data.get("checkpoint"):
        return str(report.data["checkpoint"])
    command = str((report.data.get("provenance") or {}).get("command", ""))
    try:
        words = shlex.split(command)
    except ValueError:  # a command that is not shell-quoted: nothing to read
        return None
    for i, word in enumerate(words):
        if word == "--path" and i + 1 < len(words):
            return words[i + 1]
        if word.startswith("--path="):
            return word[len("--path="):]
    return None


def _other_checkpoint(report: CardReport, checkpoint: Path) -> Optional[str]:
    """The checkpoint ``report`` names (:func:`_named_checkpoint`) where it is not the exported one (paths compared
    resolved), else None."""
    named = _named_checkpoint(report)
    return None if named is None or Path(named).resolve() == Path(checkpoint).resolve() else named


def _measured(report: CardReport, checkpoint: Path) -> str:
    """Which checkpoint ``report`` measured (where it records one) and its provenance line."""
    prov = report.data.get("provenance")
    line = (provenance_line(prov) if prov
            else "Its provenance is unrecorded (a report written before reports carried one).")
    named = _named_checkpoint(report)
    if named is None:
        where = ""
    elif _other_checkpoint(report, checkpoint) is None:
        where = " The report names the exported checkpoint."
    else:
        where = f" The report names the checkpoint `{named}`; this export is of `{checkpoint}`."
    return f"From `{report.path.name}`.{where} {line}"


def _section(report: CardReport, found: Sequence[Figure], checkpoint: Path) -> str:
    """A report's table(s) of its figures and where they come from."""
    l, data = report.training_length, report.data
    parts = []
    if report.kind == "length":
        parts.append(f"Test perplexity by evaluation length ({data.get('split', 'test')} split, "
                     f"{data.get('split_tokens', '?')} tokens, measured with fairseq-eval-lm --eval-lengths):\n\n"
                     + _table([f for f in found if f.kind == "length"], l))
    longppl = [f for f in found if f.kind == "longppl"]
    if longppl:
        parts.append(f"{longppl[0].what} (perplexity on the tokens that need the far context):\n\n"
                     + _table(longppl, l))
    for what in dict.fromkeys(f.what for f in found if f.kind not in ("length", "longppl")):
        cells = [f for f in found if f.what == what]
        details = {f.detail for f in cells}
        detail = f" ({details.pop()} per cell)" if len(details) == 1 and "" not in details else ""
        parts.append(f"{what[0].upper()}{what[1:]}{detail}, by length:\n\n" + _table(cells, l))
    return "\n\n".join(parts) + "\n\n" + _measured(report, checkpoint)


def _definitions(reports: Sequence[CardReport], l: int, checkpoint: Path) -> str:
    """The project's definitions the reports' figures meet or miss (full attention's figures), as a table naming the
    report(s) each figure comes from (and where one names another checkpoint than the exported one); "" where no
    report gives a figure a definition reads."""
    from ..experiments.reproduce.verdict import far_context_ratio

    rows = []
    by_kind: Dict[str, List[CardReport]] = {}
    for r in reports:
        by_kind.setdefault(r.kind, []).append(r)
    for r in by_kind.get("length", []):
        full = {n: x["ppl"] for n, rs in mode_rows(r.data).items() for x in rs if x.get("protocol", "stream") == "stream"}
        if l in full and 16 * l in full:
            rows.append((FLAT, full[16 * l] / full[l], [r]))
    for r in by_kind.get("length", []) + by_kind.get("longppl", []):
        evaluator = (r.data.get("longppl") or {}).get("evaluator")
        if evaluator and evaluator != "the evaluated checkpoint":
            ratio = far_context_ratio(r.data, l, "full", str(r.path))
            if ratio is not None:
                rows.append((FAR_CONTEXT, ratio, [r]))
    passkey = by_kind.get("passkey", [])
    for definition, length, which in ((RETRIEVES, 16 * l, 1), (RETRIEVES_RANKED, 8 * l, 0)):
        value = passkey_rates([r.data for r in passkey], length)[which]
        if value is not None:
            rows.append((definition, value, [r for r in passkey if passkey_rates([r.data], length)[which] is not None]))
    for r in by_kind.get("ruler", []):
        value = ruler_mean(r.data, 8 * l)
        if value is not None:
            rows.append((RULER, value, [r]))
    if not rows:
        return ""
    lines = ["| definition | rule | figure | met | from |", "|---|---|---:|---|---|"]
    for d, value, sources in rows:
        named = ", ".join(f"`{r.path.name}`" + (" (another checkpoint)" if _other_checkpoint(r, checkpoint) else "")
                          for r in sources)
        met = "yes" if d.meets(value, written_at=4) else "no"
        lines.append(f"| {d.name} | {d.rule} | {value:.4f} | {met} | {named} |")
    return "\n".join(lines)


def model_card(config, spec: str, checkpoint: Path, reports: Sequence[CardReport] = (),
               bpe: Optional[str] = "sentencepiece", name: str = "lex_lm") -> str:
    """The text of ``README.md`` for an export ``name`` (the model's name on the Hub: the export directory's) of
    ``config`` (a ``LexConfig``) running ``spec`` by default, from ``checkpoint``; ``reports``: the reports whose
    figures the card shows (:class:`CardReport`; at most one of kind ``length``); ``bpe``: the data-bin's
    ``lex_prepare.json`` ``bpe`` (``"sentencepiece"``, or None for Moses words alone).

    Raises:
        ValueError: two length reports; a report measured at another training length than the model's; two reports
            giving one figure (:func:`measured`).
    """
    from huggingface_hub import ModelCardData

    l = config.training_length
    if sum(r.kind == "length" for r in reports) > 1:
        raise ValueError("give one --length-report (the card's perplexity table).")
    for r in reports:
        if r.training_length is not None and r.training_length != l:
            raise ValueError(f"{r.path} was measured at training length {r.training_length}; the model's is {l}: "
                             "give reports of this model (their lengths are read as multiples of its l).")
    options = ", ".join(f"{k} = {v}" for k, v in sorted(config.position_options.items())) or "none"
    tags = ["lex_plugin", "fairseq", "length-extrapolation", config.pos_emb, "custom_code", "text-generation"]
    found = measured(reports)
    results = eval_results(found)
    meta = ModelCardData(library_name="transformers", pipeline_tag="text-generation", tags=list(dict.fromkeys(tags)),
                         model_name=name if results else None, eval_results=results or None).to_yaml()
    length = [(r, f) for r, f in found if r.kind == "length"]
    if length:
        perplexity = _section(*length[0], checkpoint)
    else:
        perplexity = ("Not measured for this export. Measure it with the plugin: `fairseq-eval-lm DATA --path CHECKPOINT "
                    "--user-dir lex_plugin --task lex_language_modeling --eval-lengths 256,1024,4096 --eval-windows "
                    "full,bca --report-json report.json`, then re-export with `--length-report report.json`.")
    probes = [(r, f) for r, f in found if r.kind != "length"]
    if probes:
        probed = "\n\n".join(f"### {TITLES[r.kind]} (`{r.path.name}`)\n\n" + _section(r, f, checkpoint)
                               for r, f in probes)
    else:
        probed = ("None given. Probe the model with the plugin (`lex passkey`, `lex ruler`, `lex babilong` with "
                  "`--json`, or `fairseq-eval-lm ... --longppl --report-json`), then re-export with one "
                  "`--probe-report` per report.")
    judged = _definitions(reports, l, checkpoint)
    judged = (judged + "\n\nEach figure is its report's (one model; one fine-tuning run for a probe), and the last column "
              "says where a report names another checkpoint than this export's; the project's verdict reads the mean "
              "over three fine-tuning seeds and counts a definition met only when every seed meets it.") if judged else "No report given reads a definition's figure."
    meta = "---\n" + meta + "\n---"
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

{perplexity}

## Far-context probes

{probed}

## Against the project's definitions

The definitions of lex_plugin's results (full attention's figures; a figure is judged as written, at 4 decimals):

{judged}
"""
