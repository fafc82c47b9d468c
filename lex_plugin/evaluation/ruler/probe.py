"""The RULER-lite probe: accuracy of a model on :mod:`.tasks`' prompts by candidate scoring, per (task, window,
length, depth); its table, heat maps, and the fine-tuning samples in the probe's format (``lex ruler-data``).

Each query's prompt (context and question) runs once through the key/value cache (bounded under BCA / the
sliding window, :func:`answer_query`); greedy decoding continues a copy of that cache, and its answers and
distractors then continue the cache itself as one batch. An answer counts as found when its log-probability is above every distractor's
(chance 1 / (K + 1) for each answer); a trial scores the fraction of its answers found (RULER's
``string_match_all`` in kind), a cell the mean over trials.

Ranking K + 1 candidates is a lenient test: a 7-digit value usually differs from its distractors in its first
token, so a model that copies only that token ranks the answer first. The first measure is therefore RULER's own:
greedy decoding writes as many tokens as the answer text has, plus 4 (:func:`answer_query`), and a query scores
the fraction of its answers whose tokens appear in what it wrote (``string_match_all``, on token ids).

Summaries per window (:func:`effective_length`): RULER's effective length, the longest length up to which
every length's task average, as written at 3 decimals, exceeds a threshold (RULER's 0.856, or a fraction of the
model's own average at the shortest length), and RULER's length-weighted averages (weights rising, ``wAvg (inc)``,
or falling, ``wAvg (dec)``, linearly with the length's rank).
"""

import logging
import zlib
from dataclasses import asdict, dataclass, field, fields
from typing import List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ...data.finetune import FinetuneRow
from ...modules.attention.spec import AttentionSpec
from ...rounding import half_up, product_half_up, written
from ..length_eval import progress_bar
from ..journal import CellJournal
from ..passkey import CandidateScores, ReadPrompt, read_context, read_prompt, score_continuations
from ...generation import continue_ids
from .tasks import DEPTHLESS, TASKS, make_sample

logger = logging.getLogger(__name__)

ANSWER_ROOM = 48  # tokens kept free for a fine-tuning sample's answer text (4 values, 3 names or words)
GREEDY_SLACK = 4  # tokens greedy decoding may write beyond the answer text's length
REDRAWS = 20  # prompts drawn for a trial before its length counts as too short for the task
RULER_THRESHOLD = 0.856  # RULER's effective-length threshold (Llama-2-7B's average at 4K)
AVERAGE_AT = 3  # the decimals a task average is written and judged at (RULER's bar, 85.6%, has 3)

__all__ = ["AVERAGE_AT", "RulerResult", "answer_query", "check_threshold", "effective_length", "finetune_samples",
           "format_ruler", "plot_ruler", "ruler_accuracy", "sentence_stops"]


def sentence_stops(encode) -> List[int]:
    """Token ids that end a sentence in text encoded by ``encode`` ('.', '!', '?' as the tokenizer writes them)."""
    stops = set()
    for mark in (".", "!", "?"):
        ids = encode(f"It ends{mark}").tolist()
        if ids:
            stops.add(ids[-1])
    return sorted(stops)


@dataclass
class RulerResult:
    """One (task, window, length, depth) cell: ``trials`` prompts, ``score`` the sum of the trials' fractions of
    answers ranked first, ``items`` / ``found`` the answers scored / ranked first, ``tokens`` the longest prompt
    read, ``prompt_tokens`` each trial's prompt (context and longest question) in tokens, ``queries`` the questions
    asked, ``greedy`` the sum over queries of the fraction of their answers that greedy decoding wrote
    (``string_match_all``). ``trials`` = 0: the task does not fit this length (``skipped`` says why)."""

    task: str
    window: str
    length: int
    depth: Optional[float]
    distractors: int = 9
    trials: int = 0
    score: float = 0.0
    items: int = 0
    found: int = 0
    tokens: int = 0
    queries: int = 0
    greedy: float = 0.0
    prompt_tokens: List[int] = field(default_factory=list)
    attention: dict = field(default_factory=dict)
    skipped: Optional[str] = None

    @property
    def accuracy(self) -> float:
        return self.score / max(self.trials, 1)

    @property
    def greedy_rate(self) -> float:
        """string_match_all: the mean over queries of the fraction of answers greedy decoding wrote."""
        return self.greedy / max(self.queries, 1)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["accuracy"] = self.accuracy
        out["greedy_rate"] = self.greedy_rate
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "RulerResult":
        """The result :meth:`to_dict` wrote (its derived ``accuracy`` and ``greedy_rate`` dropped)."""
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def _contains(seq: List[int], part: List[int]) -> bool:
    n = len(part)
    return any(seq[i : i + n] == part for i in range(len(seq) - n + 1))


@torch.no_grad()
def answer_query(model, prompt: Tensor, candidates: Sequence[Tensor], answer_tokens: int, spec: AttentionSpec, eos: int,
                 pad: int, context: Optional[ReadPrompt] = None) -> Tuple[CandidateScores, Tensor]:
    """One query of a probe, its prompt read once (``</s>`` put first, :func:`~lex_plugin.evaluation.passkey.read_prompt`)
    and continued twice: the candidates are scored over its caches, which they leave as they were
    (:func:`~lex_plugin.evaluation.passkey.score_continuations`), then greedy decoding writes ``answer_tokens`` +
    GREEDY_SLACK ids on the caches themselves (:func:`~lex_plugin.generation.continue_ids`).

    Args:
        prompt: (P,) int64 context and question, or the question alone when ``context`` is given (the sample's context
            read once by :func:`~lex_plugin.evaluation.passkey.read_context` under ``spec``, shared by its queries);
        candidates: N 1-D int64 tensors (the answers, then the distractors).

    Returns:
        (:class:`~lex_plugin.evaluation.passkey.CandidateScores` of the candidates, (answer_tokens + GREEDY_SLACK,)
        int64 ids greedy decoding wrote, on the CPU).
    """
    read = read_prompt(model, prompt, spec, eos, context)
    scores = score_continuations(model, read, candidates, spec, pad)
    written = continue_ids(model, read.source[0], answer_tokens + GREEDY_SLACK, eos, pad, temperature=0.0, spec=spec,
                           incremental_state=read.state)
    return scores, written


def ruler_accuracy(model, encode, filler: Tensor, tasks: Sequence[str], lengths: Sequence[int], depths: Sequence[float],
                   specs: Sequence[AttentionSpec], eos: int, pad: int, trials: int = 5, distractors: int = 9, hops: int = 2,
                   seed: int = 0, progress: bool = True, unk: Optional[int] = None,
                   journal: Optional[CellJournal] = None) -> List[RulerResult]:
    """Accuracy per (task, window, length, depth): ``trials`` prompts per cell (``fwe``: one row per length, depth
    None), the same prompts for every window (seeded by ``seed``, task, length, depth and trial).

    Args:
        model: a lex_lm model in eval mode; encode: text -> ids (``LexHubInterface.encode_fragment``).
        filler: (T,) int64 book text for the book haystacks (the data-bin's test split).
        specs: the attention specs compared; eos, pad, unk: the dictionary's ids (``unk``: refuse text it cannot spell).
        journal: the finished cells of an earlier, killed run of the same probe (read back, not computed) and where
            each cell is recorded as it finishes (:class:`~lex_plugin.evaluation.journal.CellJournal`); None: none.

    Raises:
        ValueError: as :func:`~.tasks.make_sample` (unknown task, bad depth, a length too short, too little filler).
    """
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown RULER tasks {', '.join(unknown)}; choose from {', '.join(TASKS)}.")
    stops = sentence_stops(encode)
    cells = [(t, L, d) for t in tasks for L in lengths for d in ([None] if t in DEPTHLESS else depths)]
    results = []
    bar = progress_bar(len(cells) * trials * len(specs), "ruler", "prompt", progress)
    for task, length, depth in cells:
        done = journal.get([task, length, depth]) if journal is not None else None
        if done is not None:
            results += [RulerResult.from_dict(d) for d in done]
            bar.update(trials * len(specs))
            continue
        cell = {str(s): RulerResult(task, str(s), length, depth, distractors, attention=s.fields()) for s in specs}
        for trial in range(trials):
            sample, err = None, None
            for attempt in range(REDRAWS):  # a prompt too long for this length is redrawn (the same for every window)
                key = (seed, task, length, depth, trial) + ((attempt,) if attempt else ())
                g = torch.Generator().manual_seed(zlib.crc32(repr(key).encode()))
                try:
                    sample = make_sample(task, encode, length, depth, g, filler, stops, distractors, hops, unk)
                    break
                except ValueError as error:
                    if "too short" not in str(error):
                        raise
                    err = error
            if sample is None:  # the cell keeps the trials it has (none: '-')
                logger.warning("RULER %s at length %d: %d of %d trials; %s", task, length, trial, trials, err)
                for result in cell.values():
                    result.skipped = str(err)
                bar.update((trials - trial) * len(specs))
                break
            for spec in specs:
                found = items = 0
                greedy = 0.0
                # several questions about one context (niah_multiquery): the context is read once
                context = read_context(model, sample.context, spec, eos) if len(sample.queries) > 1 else None
                for query in sample.queries:
                    prompt = query.question if context is not None else torch.cat([sample.context, query.question])
                    (scores, _), written = answer_query(model, prompt, [*query.answers, *query.distractors],
                                                        encode(query.answer_text).numel(), spec, eos, pad, context)
                    best_wrong = scores[len(query.answers):].max()
                    found += int((scores[:len(query.answers)] > best_wrong).sum())
                    items += len(query.answers)
                    greedy += sum(_contains(written.tolist(), a.tolist()) for a in query.answers) / len(query.answers)
                result = cell[str(spec)]
                result.queries += len(sample.queries)
                result.greedy += greedy
                result.trials += 1
                result.score += found / items
                result.items += items
                result.found += found
                result.tokens = max(result.tokens, sample.tokens)
                result.prompt_tokens.append(sample.tokens)
                bar.update(1)
        results += cell.values()
        if journal is not None:
            journal.put([task, length, depth], [r.to_dict() for r in cell.values()])
    bar.close()
    return results


def finetune_samples(encode, filler: Tensor, tasks: Sequence[str], count: int, max_length: int, seed: int = 0,
                     distractors: int = 9, hops: int = 2, unk: Optional[int] = None) -> List[FinetuneRow]:
    """``count`` prompts of the tasks (in turn) each followed by its answer text (one query of it), at most
    ``max_length`` tokens with the answer, each of uniform random length (between max_length / 2, or the
    shortest the task fits in, and max_length - ANSWER_ROOM) and depth: the probe's format, for
    fine-tuning at the training length (``lex ruler-data``; filler from the training split). Each row's
    ``answer`` is the answer text's token count.

    Raises:
        ValueError: ``max_length`` too short for a task's frame and answer, or the errors of :func:`make_sample`.
    """
    stops = sentence_stops(encode)
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in progress_bar(range(count), "ruler-data", "row"):
        task = tasks[i % len(tasks)]
        low, high = max_length // 2, max_length - ANSWER_ROOM
        while True:  # a uniform length among those the task's frame (intro, needles, question) fits in
            length = int(torch.randint(low, max(low, high) + 1, (1,), generator=g))
            try:
                sample = make_sample(task, encode, length, float(torch.rand((), generator=g)), g, filler, stops,
                                     distractors, hops, unk)
                break
            except ValueError as err:
                if "too short" not in str(err) or length >= high:
                    raise ValueError(f"{err} (--max-length {max_length} leaves {high} tokens for a {task} prompt)") from None
                low = length + 1
        query = sample.queries[int(torch.randint(len(sample.queries), (1,), generator=g))]
        answer = encode(query.answer_text)
        tokens = torch.cat([sample.context, query.question, answer])
        if tokens.numel() > max_length:
            raise ValueError(f"a {task} sample needs {tokens.numel()} tokens with its answer; --max-length {max_length} is "
                             "too short.")
        out.append(FinetuneRow(tokens, answer.numel()))
    return out


def _mean(rows: Sequence[RulerResult]) -> Optional[float]:
    trials = sum(r.trials for r in rows)
    return sum(r.score for r in rows) / trials if trials else None


def _greedy(rows: Sequence[RulerResult]) -> Optional[float]:
    asked = sum(r.queries for r in rows)  # 0 in reports written before greedy was counted, or a skipped cell: "-"
    return sum(r.greedy for r in rows) / asked if asked else None


MEASURES = {"greedy": _greedy, "ranking": _mean}  # RULER's string_match_all first


def _tasks_everywhere(results: Sequence[RulerResult], window: str, measure) -> List[str]:
    """The tasks with a score at every length of ``window``: a summary over lengths compares the same tasks."""
    lengths = {r.length for r in results if r.window == window}
    return [t for t in dict.fromkeys(r.task for r in results if r.window == window)
            if all(measure([r for r in results if r.task == t and r.window == window and r.length == L]) is not None
                   for L in lengths)]


def _task_average(results: Sequence[RulerResult], window: str, length: int, measure, tasks: Sequence[str]) -> Optional[float]:
    """The mean over ``tasks`` of a task's mean over depths (None without tasks)."""
    values = [measure([r for r in results if r.task == t and r.window == window and r.length == length]) for t in tasks]
    return sum(values) / len(values) if values else None


def check_threshold(threshold: float) -> None:
    """Refuse an effective-length bar written at more decimals than a task average is judged at (:data:`AVERAGE_AT`).

    Raises:
        ValueError: ``threshold`` is outside [0, 1] or has more than :data:`AVERAGE_AT` decimals (0.8555: which
            written average, 0.855 or 0.856, would pass?).
    """
    if not 0 <= threshold <= 1 or half_up(threshold, AVERAGE_AT) != threshold:
        raise ValueError(f"effective-length threshold {threshold}: give a fraction in [0, 1] with at most {AVERAGE_AT} "
                         f"decimals (RULER's is {RULER_THRESHOLD}), the decimals a task average is written and judged at.")


def effective_length(results: Sequence[RulerResult], window: str, measure: str = "greedy",
                     threshold: float = RULER_THRESHOLD, relative: Optional[float] = None) -> dict:
    """RULER's summary of one window (Hsieh et al. 2024, section 4): the task average at each length, its
    length-weighted averages, and the effective length.

    Args:
        measure: ``greedy`` (string_match_all) or ``ranking``.
        threshold: the effective length's bar (RULER: 0.856), at most :data:`AVERAGE_AT` decimals; with
            ``relative``, the bar is instead ``relative`` times the window's own average at the shortest length as
            written, worked out on decimals and kept to one more decimal than an average (0.9 x 0.003 = 0.0027,
            which 0.003 exceeds: a window never fails its own average).

    An average exceeds the bar when, rounded half up to :data:`AVERAGE_AT` decimals as :func:`format_ruler` writes
    it, it is above the bar: no written average reads otherwise than the effective length.

    Returns:
        {"tasks": the tasks averaged (those scored at every length: a task skipped at a length, too long for it,
        is left out of every average), "averages": {L: avg or None}, "wavg_inc", "wavg_dec" (weights 1..n rising /
        falling with the length's rank), "threshold" (the bar used), "effective_length": the longest L such that
        the average exceeds the bar at every length up to L, or None when the shortest does not}; the averages
        unrounded.

    Raises:
        ValueError: an unknown measure or window; a threshold that :func:`check_threshold` refuses.
    """
    check_threshold(threshold)
    if measure not in MEASURES:
        raise ValueError(f"unknown RULER measure {measure!r}; choose from {', '.join(MEASURES)}.")
    lengths = sorted({r.length for r in results if r.window == window})
    if not lengths:
        raise ValueError(f"no RULER results for window {window!r}.")
    tasks = _tasks_everywhere(results, window, MEASURES[measure])
    averages = {L: _task_average(results, window, L, MEASURES[measure], tasks) for L in lengths}
    known = [(L, v) for L, v in averages.items() if v is not None]
    n = len(known)
    inc = sum((i + 1) * v for i, (_, v) in enumerate(known)) / (n * (n + 1) / 2) if n else None
    dec = sum((n - i) * v for i, (_, v) in enumerate(known)) / (n * (n + 1) / 2) if n else None
    bar = threshold if relative is None else (product_half_up(relative, half_up(known[0][1], AVERAGE_AT), AVERAGE_AT + 1)
                                              if known else None)
    effective = None
    for L, v in averages.items():
        if v is None or bar is None or not half_up(v, AVERAGE_AT) > bar:
            break
        effective = L
    return {"tasks": tasks, "averages": averages, "wavg_inc": inc, "wavg_dec": dec, "threshold": bar,
            "effective_length": effective}


def format_ruler(results: Sequence[RulerResult], training_length: Optional[int] = None,
                 threshold: float = RULER_THRESHOLD, relative: float = 0.9) -> str:
    """Markdown: the greedy table (string_match_all: rows task x window, columns lengths, cells the mean over
    depths), the same for ranking, then per window and measure the task average, RULER's weighted averages and
    the effective length at ``threshold`` and at ``relative`` x the window's own average at the shortest length
    (:func:`effective_length`), the averages written at :data:`AVERAGE_AT` decimals, as they are judged.

    Raises:
        ValueError: a threshold that :func:`check_threshold` refuses.
    """
    check_threshold(threshold)
    lengths = sorted({r.length for r in results})
    name = (lambda L: f"{L} ({L / training_length:g}l)") if training_length else str
    chance = 1 / (1 + results[0].distractors) if results else 0
    titles = {"greedy": "RULER-lite greedy exact match (string_match_all: the fraction of each query's answers that greedy "
                        "decoding writes; mean over queries and depths)",
              "ranking": f"RULER-lite ranking (an answer counts when it outscores all distractors; chance {chance:.2f} per "
                         "answer; mean over depths; the longest prompt of each cell is in the JSON's tokens)"}
    lines = []
    for measure, value in MEASURES.items():
        lines += [*([""] if lines else []), titles[measure], "| task | window | " + " | ".join(map(name, lengths)) + " |",
                  "|---|---|" + "---:|" * len(lengths)]
        for task in dict.fromkeys(r.task for r in results):
            for window in dict.fromkeys(r.window for r in results if r.task == task):
                cells = []
                for L in lengths:
                    rows = [r for r in results if r.task == task and r.window == window and r.length == L]
                    v = value(rows) if rows else None
                    cells.append("-" if v is None else written(v, "{:.2f}"))
                lines.append(f"| {task} | {window} | " + " | ".join(cells) + " |")
    fmt = lambda v: "-" if v is None else written(v, f"{{:.{AVERAGE_AT}f}}")  # noqa: E731
    lines += ["", f"Task average per window, RULER's weighted averages and effective length (the longest length up to "
                  f"which every task average, as written, exceeds {threshold:.{AVERAGE_AT}f}, or {relative:g} x the "
                  f"window's own average at {name(lengths[0]) if lengths else '-'}, the bar beside it; over the tasks "
                  "scored at every length)",
              "| window | measure | " + " | ".join(map(name, lengths)) + " | wAvg (inc) | wAvg (dec) | effective "
              f"({threshold:.{AVERAGE_AT}f}) | effective ({relative:g} x own) |", "|---|---|" + "---:|" * (len(lengths) + 4)]
    left_out = sorted({r.task for r in results} - set(effective_length(results, results[0].window, "ranking")["tasks"])
                      if results else set())
    if left_out:
        lines[-3] += f"; left out, not scored at every length: {', '.join(left_out)}"
    for window in dict.fromkeys(r.window for r in results):
        for measure in MEASURES:
            absolute = effective_length(results, window, measure, threshold)
            own = effective_length(results, window, measure, threshold, relative)
            lines.append(f"| {window} | {measure} | " + " | ".join(fmt(absolute["averages"].get(L)) for L in lengths)
                         + f" | {fmt(absolute['wavg_inc'])} | {fmt(absolute['wavg_dec'])} | "
                         f"{absolute['effective_length'] or '-'} | {own['effective_length'] or '-'}"
                         + (f" (bar {written(own['threshold'], f'{{:.{AVERAGE_AT + 1}f}}')})"
                            if own["threshold"] is not None else "") + " |")
    return "\n".join(lines)


def plot_ruler(results: Sequence[RulerResult], out, training_length: Optional[int] = None) -> None:
    """One PNG per task (``out`` with ``_TASK`` before the suffix): heat maps depth x length, one column of panels
    per window, greedy exact match (string_match_all) in the top row and ranking below (``fwe``, ``cwe``: one row
    of cells); a length the task does not fit is blank.

    Raises:
        ValueError: no results.
    """
    if not results:
        raise ValueError("no RULER results to plot.")
    import math
    from pathlib import Path

    from ...plotting import figure, heat_map

    values = {"greedy": lambda r: r.greedy_rate if r.queries else math.nan,
              "ranking": lambda r: r.accuracy if r.trials else math.nan}
    out = Path(out)
    for task in dict.fromkeys(r.task for r in results):
        rows = [r for r in results if r.task == task]
        windows = list(dict.fromkeys(r.window for r in rows))
        path = out.with_name(f"{out.stem}_{task}{out.suffix}")
        with figure(path, 2, len(windows), (3.2 * len(windows) + 1.2, 6.2), squeeze=False, constrained_layout=True) as (fig, axes):
            image = None
            for m, (measure, value_of) in enumerate(values.items()):
                for ax, window in zip(axes[m], windows):
                    mine = [r for r in rows if r.window == window]
                    lengths = sorted({r.length for r in mine})
                    depths = sorted({r.depth for r in mine}, key=lambda d: -1 if d is None else d)
                    cell = {(r.length, r.depth): value_of(r) for r in mine}
                    grid = [[cell[(L, d)] for L in lengths] for d in depths]
                    image = heat_map(ax, grid, [f"{L / training_length:g}l" if training_length else str(L) for L in lengths],
                                     ["all" if d is None else f"{d:g}" for d in depths])
                    ax.set_title(f"{window}: {measure}", fontsize=9)
                    ax.set_xlabel("context length")
                axes[m][0].set_ylabel("depth")
            fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="score")
            fig.suptitle(f"RULER-lite {task}: {max(r.trials for r in rows)} trials per cell; greedy = string_match_all, "
                         f"ranking chance {1 / (1 + rows[0].distractors):.2f} per answer", fontsize=10)
