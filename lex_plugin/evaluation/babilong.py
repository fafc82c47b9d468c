"""BABILong-lite: bAbI reasoning facts scattered through book text (Kuratov et al., "BABILong: Testing the Limits
of LLMs with Long Context Reasoning-in-a-Haystack", NeurIPS 2024 Datasets and Benchmarks), for small models
trained on books: ``lex babilong``, ``lex babilong-data``.

Tasks (bAbI's, Weston et al. 2015, generated here from templates rather than read from the bAbI files):

* ``qa1`` single supporting fact: people move between places; "Where is Mary?" -> her last place.
* ``qa2`` two supporting facts: people also pick up and drop objects; "Where is the apple?" -> the place of
  its holder, or where it was dropped.
* ``qa3`` three supporting facts: "Where was the apple before the kitchen?" -> the place the object was in
  before it reached its current place.
* ``qa4`` two-argument relations: "The kitchen is north of the garden." ...; "What is north of the garden?"
  -> kitchen, or "What is the kitchen north of?" -> garden.
* ``qa5`` three-argument relations: "Mary gave the milk to Fred." ...; "Who gave the milk?", "Who received the
  milk?" or "What did Mary give to Fred?" -> the last such transfer's giver, receiver or object.

A sample is the story's facts, in order, each a sentence inserted at a sentence boundary of a stretch of book
text (a data-bin split) at uniformly random depths, then ``Question: ... Answer:``; the answer is one word,
written `` {answer}.`` (what ``lex babilong-data``'s fine-tuning rows end with). Scores per (task, window,
length): greedy exact match (every token of the answer word is the model's argmax after the prompt) and ranking
(the answer's log-probability above every other answer of the task: places, people or objects; chance
1 / the number of candidates, stated in the table).
"""

import logging
import math
import zlib
from dataclasses import asdict, dataclass, fields
from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from ..data.finetune import FinetuneRow
from ..modules.attention.spec import AttentionSpec
from .length_eval import progress_bar
from .journal import CellJournal
from .passkey import score_candidates
from .ruler.probe import sentence_stops
from .ruler.tasks import _book

__all__ = ["TASKS", "BabiSample", "BabilongResult", "make_story", "make_sample", "babilong_accuracy", "finetune_samples",
           "format_babilong", "plot_babilong"]

logger = logging.getLogger(__name__)

Encode = Callable[[str], Tensor]

TASKS = ("qa1", "qa2", "qa3", "qa4", "qa5")
PEOPLE = ("Mary", "John", "Sandra", "Daniel")
GIVERS = ("Mary", "Fred", "Bill", "Jeff")
PLACES = ("bathroom", "hallway", "garden", "office", "bedroom", "kitchen")
OBJECTS = ("football", "apple", "milk")
DIRECTIONS = {"north": "south", "south": "north", "east": "west", "west": "east"}
MOVE = ("{who} moved to the {where}.", "{who} went to the {where}.", "{who} journeyed to the {where}.",
        "{who} travelled to the {where}.", "{who} went back to the {where}.")
TAKE = ("{who} picked up the {what}.", "{who} got the {what}.", "{who} grabbed the {what}.", "{who} took the {what}.")
DROP = ("{who} dropped the {what}.", "{who} discarded the {what}.", "{who} put down the {what}.", "{who} left the {what}.")
GIVE = ("{who} gave the {what} to {whom}.", "{who} handed the {what} to {whom}.", "{who} passed the {what} to {whom}.")
ANSWER_ROOM = 8  # tokens kept free for a fine-tuning row's answer
REDRAWS = 20  # stories drawn for a prompt before its length counts as too short for the task


@dataclass
class BabiSample:
    """A story and its question: ``facts`` (sentences, in order), ``question`` text, ``answer`` (one word) and
    ``candidates`` (every answer of this question's type, the answer among them)."""

    task: str
    facts: List[str]
    question: str
    answer: str
    candidates: List[str]


def _pick(g: torch.Generator, items: Sequence):
    return items[int(torch.randint(len(items), (1,), generator=g))]


def _qa1(g) -> BabiSample:
    places: dict = {}
    facts = []
    for _ in range(int(torch.randint(4, 9, (1,), generator=g))):
        who, where = _pick(g, PEOPLE), _pick(g, PLACES)
        facts.append(_pick(g, MOVE).format(who=who, where=where))
        places[who] = where
    who = _pick(g, sorted(places))
    return BabiSample("qa1", facts, f"Where is {who}?", places[who], list(PLACES))


def _objects_story(g, steps: int):
    """Moves, takes and drops of people and objects, each event possible in the state it happens in; returns the
    facts and each object's history of places (consecutive distinct)."""
    place: dict = {}
    holder: dict = {}  # object -> person
    lies: dict = {}  # object -> place where it lies (dropped, or never taken: unknown)
    history = {o: [] for o in OBJECTS}
    facts = []

    def seen(obj, where):
        if where is not None and (not history[obj] or history[obj][-1] != where):
            history[obj].append(where)

    for _ in range(steps):
        who = _pick(g, PEOPLE)
        held = [o for o, h in holder.items() if h == who]
        free = [o for o in OBJECTS if o not in holder and (o not in lies or lies[o] == place.get(who))]
        kind = float(torch.rand((), generator=g))
        if who in place and free and kind < 0.3:
            obj = _pick(g, free)
            holder[obj] = who
            lies.pop(obj, None)
            seen(obj, place[who])
            facts.append(_pick(g, TAKE).format(who=who, what=obj))
        elif held and kind < 0.45:
            obj = _pick(g, held)
            del holder[obj]
            lies[obj] = place[who]
            facts.append(_pick(g, DROP).format(who=who, what=obj))
        else:
            where = _pick(g, [p for p in PLACES if p != place.get(who)])
            place[who] = where
            for obj in held:
                seen(obj, where)
            facts.append(_pick(g, MOVE).format(who=who, where=where))
    return facts, history


def _qa2(g) -> BabiSample:
    for _ in range(100):
        facts, history = _objects_story(g, int(torch.randint(6, 13, (1,), generator=g)))
        known = [o for o in OBJECTS if len(history[o]) >= 2]  # taken, then carried: two supporting facts at least
        if known:
            obj = _pick(g, known)
            return BabiSample("qa2", facts, f"Where is the {obj}?", history[obj][-1], list(PLACES))
    raise RuntimeError("qa2: no story in 100 draws carried an object")  # unreachable in practice


def _qa3(g) -> BabiSample:
    for _ in range(100):
        facts, history = _objects_story(g, int(torch.randint(8, 15, (1,), generator=g)))
        known = [o for o in OBJECTS if len(history[o]) >= 2 and history[o][-1] not in history[o][:-1]]  # "before" unique
        if known:
            obj = _pick(g, known)
            return BabiSample("qa3", facts, f"Where was the {obj} before the {history[obj][-1]}?", history[obj][-2],
                              list(PLACES))
    raise RuntimeError("qa3: no story in 100 draws carried an object")


def _qa4(g) -> BabiSample:
    order = torch.randperm(len(PLACES), generator=g).tolist()
    a, b, c = (PLACES[i] for i in order[:3])
    first = _pick(g, sorted(DIRECTIONS))
    second = _pick(g, [d for d in sorted(DIRECTIONS) if d not in (first, DIRECTIONS[first])])
    facts = [f"The {a} is {first} of the {b}.", f"The {c} is {second} of the {a}."]
    if float(torch.rand((), generator=g)) < 0.5:
        facts.reverse()
    if float(torch.rand((), generator=g)) < 0.5:
        return BabiSample("qa4", facts, f"What is {first} of the {b}?", a, list(PLACES))
    return BabiSample("qa4", facts, f"What is the {a} {first} of?", b, list(PLACES))


def _qa5(g) -> BabiSample:
    facts, transfers = [], []
    for _ in range(int(torch.randint(3, 7, (1,), generator=g))):
        who = _pick(g, GIVERS)
        whom, what = _pick(g, [p for p in GIVERS if p != who]), _pick(g, OBJECTS + ("cake",))
        facts.append(_pick(g, GIVE).format(who=who, what=what, whom=whom))
        transfers.append((who, what, whom))
    who, what, whom = transfers[-1]
    kind = int(torch.randint(3, (1,), generator=g))
    if kind == 0:
        return BabiSample("qa5", facts, f"Who gave the {what}?", who, list(GIVERS))
    if kind == 1:
        return BabiSample("qa5", facts, f"Who received the {what}?", whom, list(GIVERS))
    objects = {o for w, o, r in transfers if (w, r) == (who, whom)}
    if len(objects) > 1:  # more than one object between the two: ask about the last object's giver instead
        return BabiSample("qa5", facts, f"Who gave the {what}?", who, list(GIVERS))
    return BabiSample("qa5", facts, f"What did {who} give to {whom}?", what, list(OBJECTS + ("cake",)))


_STORIES = {"qa1": _qa1, "qa2": _qa2, "qa3": _qa3, "qa4": _qa4, "qa5": _qa5}


def make_story(task: str, g: torch.Generator) -> BabiSample:
    """The facts, question and answer of one ``task`` story (no haystack).

    Raises:
        ValueError: an unknown task.
    """
    if task not in _STORIES:
        raise ValueError(f"unknown BABILong task {task!r}; choose from {', '.join(TASKS)}.")
    return _STORIES[task](g)


def make_sample(task: str, encode: Encode, length: int, g: torch.Generator, filler: Tensor, stops: Sequence[int],
                unk: Optional[int] = None) -> Tuple[BabiSample, Tensor, Tensor, List[Tuple[int, int]]]:
    """One prompt of at most ``length`` tokens: the story's facts at uniformly random depths of a stretch of
    ``filler`` (book text), in order, each at a sentence boundary, then the question.

    Args:
        encode: text -> (n,) int64 ids without end-of-sentence (``LexHubInterface.encode_fragment``).
        filler: (T,) int64 book text; stops: token ids that end a sentence in it.
        unk: the unknown-token id: a fact, question or candidate spelled with it is refused.

    Returns:
        (story, prompt (n,) int64, answer ids, the facts' (start, end) spans in the prompt).

    Raises:
        ValueError: an unknown task, a length too short for the story, too little filler, text the vocabulary
            spells with ``unk``.
    """
    story = make_story(task, g)
    facts = [encode(f) for f in story.facts]
    question = encode(f"Question: {story.question} Answer:")
    answer = encode(story.answer)
    fill = length - question.numel() - sum(f.numel() for f in facts)
    if fill < 1:
        raise ValueError(f"a {task} story needs more than {length - fill} tokens; length {length} is too short.")
    if unk is not None and any(bool((t == unk).any()) for t in (*facts, question, *map(encode, story.candidates))):
        raise ValueError(f"the vocabulary spells part of a {task} story as the unknown token: this model cannot read it.")
    hay = _book(filler, fill, g, stops)
    at = sorted(hay.nearest(float(torch.rand((), generator=g))) for _ in facts)
    context, spans = hay.insert(list(zip(at, facts)))
    return story, torch.cat([context, question]), answer, spans


@dataclass
class BabilongResult:
    """One (task, window, length) cell: ``trials`` prompts, ``greedy`` those whose greedy continuation is the
    answer word, ``ranked`` those whose answer outscores every other candidate, ``candidates`` per question."""

    task: str
    window: str
    length: int
    trials: int = 0
    greedy: int = 0
    ranked: int = 0
    candidates: int = 0
    tokens: int = 0
    attention: dict = None

    @property
    def greedy_accuracy(self) -> float:
        return self.greedy / max(self.trials, 1)

    @property
    def ranking_accuracy(self) -> float:
        return self.ranked / max(self.trials, 1)

    def to_dict(self) -> dict:
        out = asdict(self)
        out.update(greedy_accuracy=self.greedy_accuracy, ranking_accuracy=self.ranking_accuracy)
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "BabilongResult":
        """The result :meth:`to_dict` wrote (its derived accuracies dropped)."""
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})


def babilong_accuracy(model, encode: Encode, filler: Tensor, tasks: Sequence[str], lengths: Sequence[int],
                      specs: Sequence[AttentionSpec], eos: int, pad: int, trials: int = 20, seed: int = 0,
                      progress: bool = True, unk: Optional[int] = None,
                      journal: Optional[CellJournal] = None) -> List[BabilongResult]:
    """Greedy and ranking accuracy per (task, window, length): ``trials`` prompts per cell, the same prompts for
    every window (seeded by ``seed``, task, length and trial; a story too long for the length is redrawn, and a
    cell where REDRAWS draws never fit keeps the trials it has, none at all: '-' in the table).

    ``journal``: the finished cells of an earlier, killed run of the same probe (read back, not computed) and where
    each cell is recorded as it finishes (:class:`~lex_plugin.evaluation.journal.CellJournal`); None: none.

    Raises:
        ValueError: as :func:`make_sample`.
    """
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise ValueError(f"unknown BABILong tasks {', '.join(unknown)}; choose from {', '.join(TASKS)}.")
    stops = sentence_stops(encode)
    results = []
    bar = progress_bar(len(tasks) * len(lengths) * trials * len(specs), "babilong", "prompt", progress)
    for task in tasks:
        for length in lengths:
            done = journal.get([task, length]) if journal is not None else None
            if done is not None:
                results += [BabilongResult.from_dict(d) for d in done]
                bar.update(trials * len(specs))
                continue
            cell = {str(s): BabilongResult(task, str(s), length, attention=s.fields()) for s in specs}
            for trial in range(trials):
                g = torch.Generator().manual_seed(zlib.crc32(repr((seed, task, length, trial)).encode()))
                for attempt in range(REDRAWS):  # a story too long for this length is redrawn (the same for every window)
                    try:
                        story, prompt, answer, _ = make_sample(task, encode, length, g, filler, stops, unk)
                        break
                    except ValueError as err:
                        if "too short" not in str(err):
                            raise
                else:
                    logger.warning("BABILong %s at length %d skipped: no story of %d draws fits", task, length, REDRAWS)
                    bar.update((trials - trial) * len(specs))
                    break
                others = [encode(c) for c in story.candidates if c != story.answer]
                for spec in specs:
                    scores, greedy = score_candidates(model, prompt, [answer, *others], spec, eos, pad)
                    result = cell[str(spec)]
                    result.trials += 1
                    result.greedy += int(greedy[0])
                    result.ranked += int(scores[0] > scores[1:].max())
                    result.candidates = len(story.candidates)
                    result.tokens = max(result.tokens, prompt.numel())
                    bar.update(1)
            results += cell.values()
            if journal is not None:
                journal.put([task, length], [r.to_dict() for r in cell.values()])
    bar.close()
    return results


def finetune_samples(encode: Encode, filler: Tensor, tasks: Sequence[str], count: int, max_length: int, seed: int = 0,
                     unk: Optional[int] = None) -> List[FinetuneRow]:
    """``count`` prompts of the tasks (in turn), each followed by `` {answer}.``, at most ``max_length`` tokens with
    the answer (a uniform length between max_length / 2 and max_length - ANSWER_ROOM; a story too long for the drawn
    length is redrawn, so at small lengths the rows hold the shorter stories): rows for ``--answer-only-loss``
    fine-tuning at the training length (``lex babilong-data``; filler from the training split).

    Raises:
        ValueError: ``max_length`` too short for a story, or the errors of :func:`make_sample`.
    """
    stops = sentence_stops(encode)
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in progress_bar(range(count), "babilong-data", "row"):
        task = tasks[i % len(tasks)]
        high = max_length - ANSWER_ROOM
        for attempt in range(100):  # a story too long for the drawn length is redrawn (long stories are rarer at small l)
            length = int(torch.randint(max(1, max_length // 2), max(max_length // 2, high) + 1, (1,), generator=g))
            try:
                story, prompt, _, _ = make_sample(task, encode, length, g, filler, stops, unk)
                break
            except ValueError as err:
                if "too short" not in str(err) or attempt == 99:
                    raise ValueError(f"{err} (--max-length {max_length} leaves {high} tokens for a {task} prompt)") from None
        answer = encode(f"{story.answer}.")
        tokens = torch.cat([prompt, answer])
        if tokens.numel() > max_length:
            raise ValueError(f"a {task} row needs {tokens.numel()} tokens with its answer; --max-length {max_length} is too short.")
        rows.append(FinetuneRow(tokens, answer.numel()))
    return rows


def format_babilong(results: Sequence[BabilongResult], training_length: Optional[int] = None) -> str:
    """Markdown: greedy exact match, then ranking (chance per task), rows task x window, columns lengths."""
    lengths = sorted({r.length for r in results})
    name = (lambda L: f"{L} ({L / training_length:g}l)") if training_length else str
    lines = []
    for title, value in (("BABILong-lite greedy exact match (the answer word is greedy decoding's first word)",
                          lambda r: r.greedy_accuracy),
                         ("BABILong-lite ranking (the answer outscores every other answer of its type)",
                          lambda r: r.ranking_accuracy)):
        lines += [*([""] if lines else []), title,
                  "| task | chance | window | " + " | ".join(map(name, lengths)) + " |", "|---|---:|---|" + "---:|" * len(lengths)]
        for task in dict.fromkeys(r.task for r in results):
            for window in dict.fromkeys(r.window for r in results if r.task == task):
                rows = {r.length: r for r in results if r.task == task and r.window == window}
                candidates = max(r.candidates for r in rows.values())  # 0: no story fitted any length
                chance = f"{1 / candidates:.2f}" if candidates else "-"
                cells = [f"{value(rows[L]):.2f}" if L in rows and rows[L].trials else "-" for L in lengths]
                lines.append(f"| {task} | {chance} | {window} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_babilong(results: Sequence[BabilongResult], out, training_length: Optional[int] = None) -> None:
    """One PNG: heat maps task x length, one column per window, greedy above and ranking below.

    Raises:
        ValueError: no results.
    """
    if not results:
        raise ValueError("no BABILong results to plot.")
    from ..plotting import figure, heat_map

    windows = list(dict.fromkeys(r.window for r in results))
    tasks = list(dict.fromkeys(r.task for r in results))
    lengths = sorted({r.length for r in results})
    measures = {"greedy": lambda r: r.greedy_accuracy, "ranking": lambda r: r.ranking_accuracy}
    with figure(out, 2, len(windows), (3.0 * len(windows) + 1.4, 1.0 + 0.55 * len(tasks) * 2 + 1.6), squeeze=False,
                constrained_layout=True) as (fig, axes):
        image = None
        for m, (measure, value) in enumerate(measures.items()):
            for ax, window in zip(axes[m], windows):
                cell = {(r.task, r.length): value(r) for r in results if r.window == window and r.trials}
                grid = [[cell.get((t, L), math.nan) for L in lengths] for t in tasks]
                image = heat_map(ax, grid, [f"{L / training_length:g}l" if training_length else str(L) for L in lengths], tasks)
                ax.set_title(f"{window}: {measure}", fontsize=9)
                ax.set_xlabel("context length")
        fig.colorbar(image, ax=axes.ravel().tolist(), shrink=0.6, label="accuracy")
        fig.suptitle(f"BABILong-lite: {max(r.trials for r in results)} stories per cell", fontsize=10)
