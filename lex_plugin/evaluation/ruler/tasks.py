"""RULER's synthetic tasks (Hsieh et al. 2024, NVIDIA/RULER ``scripts/synthetic.yaml``), generated as token ids
for small language models: the context, then one or more questions, each with its answers and same-typed
distractors for candidate scoring (:mod:`.probe`).

Tasks (RULER's names, so results compare in kind):

* ``niah_single_1``: one needle ``One of the special magic numbers for {key} is: {value}.`` in RULER's repeated
  noise sentences; ``niah_single_2``: the same in book text (the data-bin's own split);
* ``niah_single_3``: one needle in book text whose value is a UUID (``... special magic uuid for {key} is:
  {uuid}.``), keys words;
* ``niah_multikey_1``: 4 needles with distinct keys in book text, one queried (the queried one at the depth);
  ``niah_multikey_2``: the haystack made only of needles, one queried; ``niah_multikey_3``: the same with
  UUID keys and UUID values;
* ``niah_multivalue``: 4 needles with one key and 4 values, each value scored;
* ``niah_multiquery``: 4 needles with distinct keys, all 4 queried, one question each;
* ``vt``: variable tracking: ``VAR {X1} is {value}.``, then ``VAR {X2} is VAR {X1}.`` ... (``hops`` assignments
  after the first, default 2; RULER's ``=`` is rare in books, so written ``is``) in noise; every variable of the
  chain scored;
* ``fwe``: frequent coded words: random three-letter words drawn with Zipf frequencies (alpha = 2); the 3 most
  frequent scored against the less frequent words of the same text (no depth: one row per length);
* ``cwe``: common words extraction: a numbered list of words in which 10 common words appear ``freq_cw``
  times each and every other word 3 times (RULER's num_cw = 10, freq_ucw = 3), uncommon words added until the
  list fills the length; the 10 scored against the list's uncommon words (no depth). RULER's freq_cw = 30 needs
  300 list entries; here freq_cw is 30 where the common words fill at most half the list, and lower (down to
  5) at shorter lengths. RULER draws English words; here the words are pronounceable 5-letter non-words
  (consonant-vowel-consonant-vowel-consonant), as many as any length needs, with no frequency prior from the
  books, each spelled without the unknown token.

Keys are adjective-noun words (RULER's ``words`` keys), values 7-digit numbers, variable names 5 upper-case
letters, as RULER's; UUIDs are RULER's ``uuid4`` form (8-4-4-4-12 lower-case hexadecimal digits), drawn from the
sample's generator. Needles and chain assignments are whole sentences inserted at sentence boundaries of the
haystack, the first (or the queried) one at the boundary nearest the requested depth: no needle is ever cut.
Distractors: for niah tasks the other needles' values in the text that do not answer the query, then random
values of the same type; for ``vt`` random names; for ``fwe`` the text's words ranked below 3; for ``cwe`` the
list's uncommon words. None equals an answer.

RULER asks the multi-query task once for all keys and scores free generation (``string_match_all``); here each
answer is scored on its own against the distractors, and the trial's score is the fraction found.
"""

import string
from dataclasses import dataclass, field
from typing import Callable, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from .templates import (NOISE, NIAH_INTRO, NEEDLE, QUESTION, QUESTION_ALL, VT_FIRST, VT_NEXT, VT_INTRO, VT_QUESTION,
                        FWE_INTRO, FWE_QUESTION, ADJECTIVES, NOUNS, NEEDLE_UUID, QUESTION_UUID, CWE_INTRO, CWE_QUESTION)

__all__ = ["DEPTHLESS", "NOISE", "Query", "RulerSample", "TASKS", "make_sample"]

Encode = Callable[[str], Tensor]

# cwe: RULER's common-word count and frequencies (common_words_extraction.py)
CWE_COMMON, CWE_FREQ, CWE_FREQ_UNCOMMON, CWE_FREQ_LEAST = 10, 30, 3, 5
NEEDLES = 4  # RULER's num_needle_k / num_needle_v / num_needle_q for the multi tasks
FWE_TOP = 3
FWE_ALPHA = 2.0
FWE_VOCAB = 200


@dataclass
class Query:
    """One question after the context: its tokens, the answers it requires (each scored on its own), and
    same-typed distractors (none equal to an answer). ``answer_text``: the answers as the model should continue
    (fine-tuning samples)."""

    question: Tensor
    answers: List[Tensor]
    distractors: List[Tensor]
    answer_text: str = ""


@dataclass
class RulerSample:
    """A generated prompt: ``context`` (n,) int64, its ``queries``, where its needles sit (``needles``: (start,
    end) token spans in ``context``, the depth one first) and the depth asked for (None for ``fwe``)."""

    task: str
    context: Tensor
    queries: List[Query]
    needles: List[Tuple[int, int]] = field(default_factory=list)
    depth: Optional[float] = None

    @property
    def tokens(self) -> int:
        """Tokens of the longest prompt (context and question): what the model reads."""
        return self.context.numel() + max(q.question.numel() for q in self.queries)


def _number(g: torch.Generator, taken: set) -> str:
    while True:
        value = str(int(torch.randint(10**6, 10**7, (1,), generator=g)))
        if value not in taken:
            taken.add(value)
            return value


def _uuid(g: torch.Generator, taken: set) -> str:
    while True:
        digits = "".join("0123456789abcdef"[int(i)] for i in torch.randint(16, (32,), generator=g))
        value = f"{digits[:8]}-{digits[8:12]}-4{digits[13:16]}-{'89ab'[int(digits[16], 16) % 4]}{digits[17:20]}-{digits[20:]}"
        if value not in taken:
            taken.add(value)
            return value


def _key(g: torch.Generator, taken: set) -> str:
    while True:
        key = f"{ADJECTIVES[int(torch.randint(len(ADJECTIVES), (1,), generator=g))]}-" \
              f"{NOUNS[int(torch.randint(len(NOUNS), (1,), generator=g))]}"
        if key not in taken:
            taken.add(key)
            return key


def _name(g: torch.Generator, taken: set) -> str:
    while True:
        name = "".join(string.ascii_uppercase[int(i)] for i in torch.randint(26, (5,), generator=g))
        if name not in taken:
            taken.add(name)
            return name


class _Haystack:
    """Haystack tokens with the positions where a sentence ends (insertion points)."""

    def __init__(self, tokens: Tensor, boundaries: List[int]):
        self.tokens, self.boundaries = tokens, sorted(set([0, *boundaries, tokens.numel()]))

    def nearest(self, fraction: float) -> int:
        target = fraction * self.tokens.numel()
        return min(self.boundaries, key=lambda b: abs(b - target))

    def insert(self, pieces: Sequence[Tuple[int, Tensor]]) -> Tuple[Tensor, List[Tuple[int, int]]]:
        """Insert (boundary, tokens) pieces (in the given order where boundaries are equal); return the context
        and each piece's (start, end) span in it, in the order given."""
        order = sorted(range(len(pieces)), key=lambda i: (pieces[i][0], i))
        out, spans, last, shift = [], [None] * len(pieces), 0, 0
        for i in order:
            at, piece = pieces[i]
            out.append(self.tokens[last:at])
            spans[i] = (at + shift, at + shift + piece.numel())
            out.append(piece)
            shift += piece.numel()
            last = at
        out.append(self.tokens[last:])
        return torch.cat(out), spans


def _noise(encode: Encode, n: int) -> _Haystack:
    sentences = [encode(s) for s in NOISE]
    parts, ends, total, i = [], [], 0, 0
    while total < n:
        s = sentences[i % len(sentences)]
        parts.append(s)
        total += s.numel()
        ends.append(total)
        i += 1
    tokens = torch.cat(parts)[:n] if parts else torch.zeros(0, dtype=torch.long)
    return _Haystack(tokens, [e for e in ends if e <= n])


def _book(filler: Tensor, n: int, g: torch.Generator, stops: Sequence[int]) -> _Haystack:
    if filler.numel() <= n:
        raise ValueError(f"the haystack text holds {filler.numel():,} tokens, fewer than the {n:,} this length needs; "
                         "lower the lengths or take a larger split.")
    offset = int(torch.randint(0, filler.numel() - n, (1,), generator=g))
    stop_ids = torch.tensor(list(stops), dtype=filler.dtype)
    # start after the first sentence end past the offset, so the haystack (and a needle put at its start) never splits
    # a word; looked for a stretch at a time (a split holds millions of tokens, a sentence ends within a few dozen)
    last = filler.numel() - n
    for start in range(offset, last, _STOP_SEARCH):
        later = torch.isin(filler[start:min(start + _STOP_SEARCH, last)], stop_ids).nonzero().flatten()
        if later.numel():
            offset = start + int(later[0]) + 1
            break
    tokens = filler[offset:offset + n]
    ends = (torch.isin(tokens, stop_ids).nonzero().flatten() + 1).tolist()
    return _Haystack(tokens, ends)


_STOP_SEARCH = 4096  # tokens of filler searched at a time for a sentence end


def _needle_haystack(encode: Encode, n: int, g: torch.Generator, keys: set, values: set, uuids: bool = False) -> _Haystack:
    parts, ends, total = [], [], 0
    while total < n:
        s = encode(NEEDLE_UUID.format(key=_uuid(g, keys), value=_uuid(g, values)) if uuids else
                   NEEDLE.format(key=_key(g, keys), value=_number(g, values)))
        parts.append(s)
        total += s.numel()
        ends.append(total)
    return _Haystack(torch.cat(parts)[:n], [e for e in ends if e <= n])


def _values_in(distractor_values: Sequence[str], count: int, g: torch.Generator, taken: set, draw=None) -> List[str]:
    out = list(distractor_values)[:count]
    while len(out) < count:
        out.append((draw or _number)(g, taken))
    return out


def _frame(encode: Encode, intro: str, length: int, question_texts: Sequence[str], pieces_texts: Sequence[str]) -> Tuple[Tensor, List[Tensor], List[Tensor], int]:
    intro_t = encode(intro)
    questions = [encode(q) for q in question_texts]
    pieces = [encode(p) for p in pieces_texts]
    fill = length - intro_t.numel() - max(q.numel() for q in questions) - sum(p.numel() for p in pieces)
    if fill < 1:
        raise ValueError(f"a prompt of this task needs more than {length - fill} tokens (intro, needles, question); "
                         f"length {length} is too short.")
    return intro_t, questions, pieces, fill


def _niah(task: str, encode: Encode, length: int, depth: float, g: torch.Generator, filler: Optional[Tensor],
          stops: Sequence[int], distractors: int) -> RulerSample:
    keys, values = set(), set()
    n_needles = 1 if task.startswith("niah_single") else NEEDLES
    uuid_values, uuid_keys = task in ("niah_single_3", "niah_multikey_3"), task == "niah_multikey_3"
    value_of = _uuid if uuid_values else _number
    key_of = _uuid if uuid_keys else _key
    needle, question = (NEEDLE_UUID, QUESTION_UUID) if uuid_values else (NEEDLE, QUESTION)
    if task == "niah_multivalue":
        key = key_of(g, keys)
        needles = [(key, value_of(g, values)) for _ in range(n_needles)]
    else:
        needles = [(key_of(g, keys), value_of(g, values)) for _ in range(n_needles)]
    if task == "niah_multivalue":
        asked = [(needles[0][0], [v for _, v in needles])]
        question_texts = [QUESTION_ALL.format(key=needles[0][0])]
    elif task == "niah_multiquery":
        asked = [(k, [v]) for k, v in needles]
        question_texts = [question.format(key=k) for k, _ in needles]
    else:
        asked = [(needles[0][0], [needles[0][1]])]
        question_texts = [question.format(key=needles[0][0])]
    intro, questions, pieces, fill = _frame(encode, NIAH_INTRO, length, question_texts,
                                            [needle.format(key=k, value=v) for k, v in needles])
    if task == "niah_single_1":
        hay = _noise(encode, fill)
    elif task in ("niah_multikey_2", "niah_multikey_3"):
        hay = _needle_haystack(encode, fill, g, keys, values, uuids=uuid_keys)
    else:
        if filler is None:
            raise ValueError(f"{task} hides its needles in book text: give the filler stream (the data-bin's split).")
        hay = _book(filler, fill, g, stops)
    # the first needle at the depth; the others at uniformly random depths
    at = [hay.nearest(depth)] + [hay.nearest(float(torch.rand((), generator=g))) for _ in needles[1:]]
    context, spans = hay.insert(list(zip(at, pieces)))
    context = torch.cat([intro, context])
    spans = [(a + intro.numel(), b + intro.numel()) for a, b in spans]
    in_text = [v for _, v in needles]
    queries = []
    for (key, answers), question in zip(asked, questions):
        others = [v for v in in_text if v not in answers]  # the text's other values first: key-value binding
        wrong = _values_in(others, distractors, g, values, value_of)
        queries.append(Query(question, [encode(a) for a in answers],
                             [encode(w) for w in wrong], ", ".join(answers) + "."))
    return RulerSample(task, context, queries, spans, depth)


def _vt(encode: Encode, length: int, depth: float, g: torch.Generator, distractors: int, hops: int) -> RulerSample:
    names, values = set(), set()
    chain = [_name(g, names) for _ in range(hops + 1)]
    value = _number(g, values)
    statements = [VT_FIRST.format(name=chain[0], value=value)] + [VT_NEXT.format(name=b, previous=a) for a, b in zip(chain, chain[1:])]
    intro, questions, pieces, fill = _frame(encode, VT_INTRO, length, [VT_QUESTION.format(value=value)], statements)
    hay = _noise(encode, fill)
    # the first assignment at the depth, the later ones in order at random depths after it
    later = sorted(float(torch.rand((), generator=g)) * (1 - depth) + depth for _ in statements[1:])
    at = [hay.nearest(depth)] + [max(hay.nearest(f), hay.nearest(depth)) for f in later]
    context, spans = hay.insert(list(zip(at, pieces)))
    context = torch.cat([intro, context])
    spans = [(a + intro.numel(), b + intro.numel()) for a, b in spans]
    wrong = [_name(g, names) for _ in range(distractors)]
    query = Query(questions[0], [encode(n) for n in chain], [encode(n) for n in wrong], ", ".join(chain) + ".")
    return RulerSample("vt", context, [query], spans, depth)


def _fwe(encode: Encode, length: int, g: torch.Generator, distractors: int) -> RulerSample:
    taken: set = set()
    vocab = []
    while len(vocab) < FWE_VOCAB:
        word = "".join(string.ascii_lowercase[int(i)] for i in torch.randint(26, (3,), generator=g))
        if word not in taken:
            taken.add(word)
            vocab.append(word)
    intro, questions, _, fill = _frame(encode, FWE_INTRO, length, [FWE_QUESTION], [])
    encoded = [encode(w) for w in vocab]
    # Zipf frequencies p(rank r) ~ r^-alpha over the vocabulary, words drawn until the context is full
    weights = torch.tensor([r ** -FWE_ALPHA for r in range(1, FWE_VOCAB + 1)], dtype=torch.float64)
    for _ in range(100):  # redrawn until the three most frequent words are defined (no tie at the third place)
        parts, total, counts = [], 0, [0] * FWE_VOCAB
        while True:
            r = int(torch.multinomial(weights, 1, generator=g))
            if total + encoded[r].numel() > fill:
                break
            parts.append(encoded[r])
            total += encoded[r].numel()
            counts[r] += 1
        ranked = sorted(range(FWE_VOCAB), key=lambda r: (-counts[r], r))
        if counts[ranked[FWE_TOP - 1]] > counts[ranked[FWE_TOP]]:
            break
    else:
        raise ValueError(f"fwe at length {length}: no draw of coded words had a unique top {FWE_TOP}; use a longer length.")
    top = ranked[:FWE_TOP]
    lesser = [r for r in ranked[FWE_TOP:] if counts[r] > 0]
    lesser += [r for r in ranked[FWE_TOP:] if counts[r] == 0]  # words of the code not drawn
    wrong = lesser[:distractors]
    context = torch.cat([intro, *parts])
    query = Query(questions[0], [encoded[r] for r in top], [encoded[r] for r in wrong],
                  ", ".join(vocab[r] for r in top) + ".")
    return RulerSample("fwe", context, [query], [], None)


def _pseudo_word(g: torch.Generator, taken: set) -> str:
    """A pronounceable 5-letter non-word (consonant-vowel-consonant-vowel-consonant), not drawn before."""
    consonants, vowels = "bcdfghjklmnprstvz", "aeiou"
    while True:
        word = "".join(pool[int(torch.randint(len(pool), (1,), generator=g))]
                       for pool in (consonants, vowels, consonants, vowels, consonants))
        if word not in taken:
            taken.add(word)
            return word


def _cwe(encode: Encode, length: int, g: torch.Generator, distractors: int, unk: Optional[int]) -> RulerSample:
    taken: set = set()

    def word() -> Tuple[str, Tensor]:
        for _ in range(1000):
            w = _pseudo_word(g, taken)
            ids = encode(w)
            if unk is None or not bool((ids == unk).any()):
                return w, ids
        raise ValueError("the vocabulary spells part of a cwe prompt as the unknown token: 1,000 drawn words all "
                         "needed it; this model cannot read the task's text.")

    intro, questions, _, fill = _frame(encode, CWE_INTRO, length, [CWE_QUESTION], [])
    common = [word() for _ in range(CWE_COMMON)]
    number_cost = [0]  # number_cost[n]: tokens of the labels "1." .. "n."
    entry = sum(ids.numel() for _, ids in common) / CWE_COMMON + encode(f"{CWE_FREQ * CWE_COMMON}.").numel()
    freq = min(CWE_FREQ, int(fill // entry) // 2 // CWE_COMMON)  # the common words fill at most half the list
    if freq < CWE_FREQ_LEAST:
        raise ValueError(f"a cwe prompt needs {CWE_COMMON} common words {CWE_FREQ_LEAST} times each and {distractors} "
                         f"uncommon words {CWE_FREQ_UNCOMMON} times each; length {length} is too short.")

    def cost(entries: int, word_tokens: int) -> int:
        while len(number_cost) <= entries:
            number_cost.append(number_cost[-1] + encode(f"{len(number_cost)}.").numel())
        return number_cost[entries] + word_tokens

    words = [w for w in common for _ in range(freq)]
    word_tokens = freq * sum(ids.numel() for _, ids in common)
    uncommon = []
    while True:  # uncommon words, 3 times each, while the list fits
        w, ids = word()
        more = CWE_FREQ_UNCOMMON * ids.numel()
        if cost(len(words) + CWE_FREQ_UNCOMMON, word_tokens + more) > fill:
            break
        uncommon.append((w, ids))
        words += [(w, ids)] * CWE_FREQ_UNCOMMON
        word_tokens += more
    if len(uncommon) < distractors:
        raise ValueError(f"a cwe prompt needs {CWE_COMMON} common words {CWE_FREQ_LEAST} times each and {distractors} "
                         f"uncommon words {CWE_FREQ_UNCOMMON} times each; length {length} is too short.")
    words = [words[i] for i in torch.randperm(len(words), generator=g).tolist()]
    parts = [piece for n, (_, ids) in enumerate(words) for piece in (encode(f"{n + 1}."), ids)]  # RULER's numbered list
    context = torch.cat([intro, *parts])
    query = Query(questions[0], [ids for _, ids in common], [ids for _, ids in uncommon[:distractors]],
                  ", ".join(w for w, _ in common) + ".")
    return RulerSample("cwe", context, [query], [], None)


TASKS = ("niah_single_1", "niah_single_2", "niah_single_3", "niah_multikey_1", "niah_multikey_2", "niah_multikey_3",
         "niah_multivalue", "niah_multiquery", "vt", "fwe", "cwe")
DEPTHLESS = ("fwe", "cwe")  # one row per length


def make_sample(task: str, encode: Encode, length: int, depth: Optional[float], g: torch.Generator,
                filler: Optional[Tensor] = None, stops: Sequence[int] = (), distractors: int = 9, hops: int = 2,
                unk: Optional[int] = None) -> RulerSample:
    """One prompt of ``task`` with at most ``length`` tokens (context and its longest question).

    Args:
        task: a name of :data:`TASKS`.
        encode: text -> (n,) int64 ids without end-of-sentence (``LexHubInterface.encode_fragment``).
        length: the prompt length L in tokens.
        depth: relative position in [0, 1] of the (queried) needle or the chain's first assignment; ignored by
            ``fwe`` and ``cwe``.
        g: the generator every draw uses (deterministic by its seed).
        filler: (T,) int64 book text for the book haystacks (``niah_single_2``, ``niah_single_3``,
            ``niah_multikey_1``, ``niah_multivalue``, ``niah_multiquery``).
        stops: token ids that end a sentence in ``filler`` (needles go after them).
        distractors: K same-typed distractors per query (chance 1 / (K + 1)).
        hops: ``vt``'s assignments after the first.
        unk: the dictionary's unknown-token id: a needle, question, answer or distractor the vocabulary cannot
            spell is refused (the probe would measure nothing).

    Returns:
        The sample; its context plus any question has at most ``length`` tokens.

    Raises:
        ValueError: an unknown task, a depth outside [0, 1], a length too short for the task's frame, a
            filler too short (or missing) for a book haystack, text the vocabulary spells with ``unk``.
    """
    if task not in TASKS:
        raise ValueError(f"unknown RULER task {task!r}; choose from {', '.join(TASKS)}.")
    if task not in DEPTHLESS and (depth is None or not 0.0 <= depth <= 1.0):
        raise ValueError(f"depths are fractions of the context in [0, 1], got {depth}.")
    if distractors < 1:
        raise ValueError(f"candidate scoring needs at least one distractor, got {distractors}.")
    if task == "vt":
        if hops < 1:
            raise ValueError(f"variable tracking needs at least one hop, got {hops}.")
        sample = _vt(encode, length, depth, g, distractors, hops)
    elif task == "fwe":
        sample = _fwe(encode, length, g, distractors)
    elif task == "cwe":
        sample = _cwe(encode, length, g, distractors, unk)
    else:
        sample = _niah(task, encode, length, depth, g, filler, stops, distractors)
    if unk is not None:
        generated = [t for s, e in sample.needles for t in [sample.context[s:e]]]
        generated += [t for q in sample.queries for t in (q.question, *q.answers, *q.distractors)]
        if any(bool((t == unk).any()) for t in generated):
            raise ValueError(f"the vocabulary spells part of a {task} prompt as the unknown token: this model cannot read "
                             "the task's text (prepare the corpus with a vocabulary that covers digits and capitals).")
    return sample
