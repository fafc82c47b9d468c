"""RULER-lite (lex ruler, lex ruler-data): each task's generator against its invariants on real book text and the
model's own tokenizer, the scorer against an oracle that reads the prompt (1.0) and against a model that
provably cannot see the needle (chance within a binomial interval), and the commands end to end."""

import json
import math
import re
import sys
from collections import Counter, deque

import pytest
import torch

from conftest import TRAIN_LEN, run_cli
from lex_plugin.evaluation.passkey import CandidateScores
from lex_plugin.evaluation.ruler import (TASKS, RulerResult, effective_length, finetune_samples, make_sample,
                                        ruler_accuracy, sentence_stops)
from lex_plugin.evaluation.ruler import probe as probe_module
from lex_plugin.evaluation.ruler.tasks import FWE_INTRO, NOISE

LAYERS = 4  # lex_lm_tiny
NEEDLE_RE = r"One of the special magic numbers for ([a-z]+-[a-z]+) is: (\d{7})\."
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
NEEDLE_UUID_RE = rf"One of the special magic uuids for ([a-z]+-[a-z]+|{UUID}) is: ({UUID})\."
LENGTH = {"niah_multikey_3": 16 * TRAIN_LEN, "cwe": 16 * TRAIN_LEN}  # (this small BPE spells a UUID in ~30 tokens)


def _sample(hub, filler, task, length, depth, seed=0):
    g = torch.Generator().manual_seed(seed)
    return make_sample(task, hub.encode_fragment, length, depth, g, filler, sentence_stops(hub.encode_fragment),
                       unk=hub.src_dict.unk())


@pytest.mark.parametrize("task", TASKS)
def test_each_generator_keeps_its_invariants(hub, filler, task):
    """At 4l and depths 0, 0.5, 1: the prompt fits the length; every needle is whole; the answers are in the text
    as often as the task says; the distractors are distinct and none is an answer; the same seed gives the same
    prompt."""
    length = LENGTH.get(task, 4 * TRAIN_LEN)
    for depth in (0.0, 0.5, 1.0):
        s = _sample(hub, filler, task, length, depth)
        assert all(s.context.numel() + q.question.numel() <= length for q in s.queries)
        assert s.tokens > length - 40  # filled, short of the length by at most a haystack sentence
        text = hub.decode(s.context)
        for query in s.queries:
            answers = [hub.decode(a) for a in query.answers]
            wrong = [hub.decode(d) for d in query.distractors]
            assert len(wrong) == 9 and len(set(wrong)) == 9 and not set(wrong) & set(answers)
        if task.startswith("niah"):
            needle = NEEDLE_UUID_RE if task.endswith("_3") else NEEDLE_RE
            for start, end in s.needles:
                assert re.fullmatch(needle, hub.decode(s.context[start:end]))
            found = re.findall(needle, text)
            if task not in ("niah_multikey_2", "niah_multikey_3"):
                assert len(found) == len(s.needles) == (1 if task.startswith("niah_single") else 4), text
            for query in s.queries:
                key = re.search(rf"for ([a-z]+-[a-z]+|{UUID}) mentioned", hub.decode(query.question)).group(1)
                values = [v for k, v in found if k == key]
                assert sorted(values) == sorted(hub.decode(a) for a in query.answers)
                assert len(values) == (4 if task == "niah_multivalue" else 1)
        elif task == "vt":
            chain = [hub.decode(a) for a in s.queries[0].answers]
            assert len(chain) == 3 and [a for a, _ in s.needles] == sorted(a for a, _ in s.needles)  # in order
            value = re.search(r"the value (\d{7})", hub.decode(s.queries[0].question)).group(1)
            assert f"VAR {chain[0]} is {value}." in text
            assert all(f"VAR {b} is VAR {a}." in text for a, b in zip(chain, chain[1:]))
        elif task == "cwe":  # 10 words at least 5 times each, every other word 3 times; the distractors among those
            entries = re.findall(r"(\d+)\. ([a-z]+)", text)
            assert [int(n) for n, _ in entries] == list(range(1, len(entries) + 1))  # RULER's numbered list
            counts = Counter(w for _, w in entries)
            common = [hub.decode(a) for a in s.queries[0].answers]
            assert len(common) == 10 and len({counts[w] for w in common}) == 1 and counts[common[0]] >= 5
            assert all(counts[w] == 3 for w in counts if w not in common)
            assert all(counts[hub.decode(d)] == 3 for d in s.queries[0].distractors)
        else:  # fwe: the three answers are strictly more frequent than every distractor
            counts = Counter(text.split(hub.decode(hub.encode_fragment(FWE_INTRO)))[-1].split())
            top = [hub.decode(a) for a in s.queries[0].answers]
            assert min(counts[w] for w in top) > max(counts[hub.decode(d)] for d in s.queries[0].distractors)
            assert top == [w for w, _ in counts.most_common(3)]  # unique: the generator redraws ties at the third place
        again = _sample(hub, filler, task, length, depth)
        assert torch.equal(again.context, s.context) and all(
            torch.equal(a.question, b.question) for a, b in zip(again.queries, s.queries))


def test_needles_sit_within_one_sentence_of_their_depth(hub, filler):
    """In the noise haystack (sentences of at most a few tokens) the needle starts within one sentence of the
    requested fraction of the haystack; in book text it moves with the depth."""
    longest = max(hub.encode_fragment(s).numel() for s in NOISE)
    for depth in (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0):
        s = _sample(hub, filler, "niah_single_1", 8 * TRAIN_LEN, depth)
        start, end = s.needles[0]
        intro = hub.encode_fragment(
            "Some special magic numbers are hidden within the following text. Make sure to memorize it. "
            "I will quiz you about the numbers afterwards.").numel()
        haystack = s.context.numel() - intro - (end - start)
        assert abs(start - intro - depth * haystack) <= longest, (depth, start, intro, haystack)
    starts = [_sample(hub, filler, "niah_single_2", 8 * TRAIN_LEN, d).needles[0][0] for d in (0.1, 0.5, 0.9)]
    assert starts == sorted(starts) and starts[2] - starts[0] > 4 * TRAIN_LEN


def test_text_the_vocabulary_cannot_spell_is_refused(hub, filler):
    def encode(text):  # a vocabulary without '='-like symbols: every capital letter unknown
        ids = hub.encode_fragment(text)
        return ids.masked_fill(torch.tensor([any(c.isupper() for c in hub.src_dict[i]) for i in ids.tolist()],
                                            dtype=torch.bool), hub.src_dict.unk())

    with pytest.raises(ValueError, match="unknown token"):
        make_sample("vt", encode, 4 * TRAIN_LEN, 0.5, torch.Generator().manual_seed(0), unk=hub.src_dict.unk())
    def no_hex(text):  # a vocabulary that cannot spell the letters of a UUID, or any letter
        ids = hub.encode_fragment(text)
        return ids.masked_fill(torch.tensor([any(c in "abcdef" for c in hub.src_dict[i]) for i in ids.tolist()],
                                            dtype=torch.bool), hub.src_dict.unk())

    for task in ("niah_single_3", "niah_multikey_3", "cwe"):
        with pytest.raises(ValueError, match="unknown token"):
            make_sample(task, no_hex, 16 * TRAIN_LEN, 0.5, torch.Generator().manual_seed(0), filler,
                        sentence_stops(hub.encode_fragment), unk=hub.src_dict.unk())
    with pytest.raises(ValueError, match="unknown RULER task"):
        make_sample("qa_1", hub.encode_fragment, 256, 0.5, torch.Generator())
    with pytest.raises(ValueError, match="too short"):
        make_sample("niah_multiquery", hub.encode_fragment, 60, 0.5, torch.Generator(), filler)


def _answers(hub, prompt):
    """What a reader of the prompt's text who knows every task answers."""
    text = hub.decode(prompt)
    question = text[text.rfind("?") - 200:]
    if "magic uuid" in question:
        key = re.findall(rf"for ([a-z]+-[a-z]+|{UUID}) mentioned", question)[-1]
        return [v for k, v in re.findall(NEEDLE_UUID_RE, text) if k == key]
    if "magic number" in question:
        key = re.findall(r"for ([a-z]+-[a-z]+) mentioned", question)[-1]
        return [v for k, v in re.findall(NEEDLE_RE, text) if k == key]
    if "most common words" in question:
        return [w for w, _ in Counter(re.findall(r"\d+\. ([a-z]+)", text)).most_common(10)]
    if "variables" in question:
        value = re.findall(r"the value (\d{7})", question)[-1]
        right, edges = set(), re.findall(r"VAR ([A-Z]{5}) is (VAR )?([A-Z]{5}|\d{7})\.", text)
        right |= {a for a, _, b in edges if b == value}
        for _ in range(10):
            right |= {a for a, _, b in edges if b in right}
        return sorted(right)
    coded = text.split(hub.decode(hub.encode_fragment(FWE_INTRO)))[-1].split("What are")[0].split()
    return [w for w, _ in Counter(coded).most_common(3)]


def _oracle(hub):
    """answer_query of that reader: 0 for what the text answers, -1 else; greedy decoding writes them all."""
    def answer(model, prompt, candidates, answer_tokens, spec, eos, pad, context=None):
        if context is not None:  # the question of a context read once: the reader reads both
            prompt = torch.cat([context.source[0, 1:], prompt])
        right = _answers(hub, prompt)
        scores = torch.tensor([0.0 if hub.decode(c) in set(right) else -1.0 for c in candidates], dtype=torch.float64)
        return CandidateScores(scores, scores.eq(0)), hub.encode_fragment(", ".join(right) + ".")
    return answer


def test_an_oracle_that_reads_the_prompt_scores_one(hub, filler, monkeypatch):
    monkeypatch.setattr(probe_module, "answer_query", _oracle(hub))
    lengths = [4 * TRAIN_LEN, 16 * TRAIN_LEN]
    results = ruler_accuracy(hub.models[0], hub.encode_fragment, filler, TASKS, lengths, [0.2, 0.8],
                             [hub.spec], hub.src_dict.eos(), hub.src_dict.pad(), trials=2, progress=False, unk=hub.src_dict.unk())
    assert len(results) == 9 * 2 * 2 + 2 * 2  # fwe, cwe: one row per length
    skipped = {(r.task, r.length) for r in results if r.skipped}
    assert skipped == {("niah_multikey_3", 4 * TRAIN_LEN), ("cwe", 4 * TRAIN_LEN)}  # too short there: '-'
    ran = [r for r in results if not r.skipped]
    assert all(r.accuracy == 1.0 and r.found == r.items > 0 for r in ran), [(r.task, r.accuracy) for r in ran if r.accuracy < 1]
    assert all(r.greedy == r.queries >= r.trials for r in ran), [(r.task, r.greedy, r.queries) for r in ran]
    assert all(r.trials == r.queries == 0 for r in results if r.skipped)
    for measure in ("greedy", "ranking"):
        summary = effective_length(results, str(hub.spec), measure)
        assert summary["averages"] == {L: 1.0 for L in lengths} and summary["effective_length"] == 16 * TRAIN_LEN


@pytest.mark.parametrize("writes", ["a distractor", "one answer"])
def test_greedy_counts_a_written_answer_never_a_written_distractor(hub, filler, monkeypatch, writes):
    """Stub scorers that rank the answers first, with greedy decoding that writes one distractor (greedy must stay
    0), or the first answer of each query only (string_match_all: 1 for a one-answer query, 1/4 for
    niah_multivalue's four)."""
    answer_counts = deque()  # each query's number of answers, in the order the probe scores them (one spec)
    make_sample_real = probe_module.make_sample

    def make(*args, **kwargs):
        sample = make_sample_real(*args, **kwargs)
        answer_counts.extend(len(q.answers) for q in sample.queries)
        return sample

    def stub(model, prompt, candidates, answer_tokens, spec, eos, pad, context=None):  # candidates: [*answers, *distractors]
        answers = answer_counts.popleft()
        scores = torch.tensor([0.0] * answers + [-1.0] * (len(candidates) - answers), dtype=torch.float64)
        written = candidates[answers if writes == "a distractor" else 0]
        return (CandidateScores(scores, torch.zeros(len(candidates), dtype=torch.bool)),
                torch.cat([hub.encode_fragment("It is"), written, hub.encode_fragment(".")]))

    monkeypatch.setattr(probe_module, "make_sample", make)
    monkeypatch.setattr(probe_module, "answer_query", stub)
    results = ruler_accuracy(hub.models[0], hub.encode_fragment, filler, ["niah_single_1", "niah_multivalue"],
                             [4 * TRAIN_LEN], [0.5], [hub.spec], hub.src_dict.eos(), hub.src_dict.pad(), trials=2,
                             progress=False, unk=hub.src_dict.unk())
    assert not answer_counts and all(r.accuracy == 1.0 for r in results)
    assert any(r.items > r.queries for r in results)  # a task with several answers per query was scored
    for r in results:
        assert r.queries >= r.trials > 0
        expected = 0 if writes == "a distractor" else r.queries / (4 if r.task == "niah_multivalue" else 1)
        assert r.greedy == pytest.approx(expected), (r.task, r.greedy, r.queries)


@pytest.mark.parametrize("mode,sinks", [("full", None), ("bca", None), ("sliding", 2), ("lm_infinite", None),
                                        ("dca", None), ("rerope", None)])
def test_one_read_prompt_gives_what_two_fresh_reads_give(hub, filler, mode, sinks):
    """answer_query reads the prompt once and continues it twice (greedy decoding on a fork of the caches, then the
    candidates): the written ids equal greedy decoding from fresh caches, token by token the argmax of a parallel
    forward over the whole sequence, and each candidate's log-probability equals a parallel forward over prompt and
    candidate (1e-5 nats), at 3l, under every kind of cache (bounded, sinks, raw keys of a position map). The context
    read once and continued by its question (read_context) gives the same, twice from the same context."""
    from lex_plugin.generation import continue_ids

    spec = hub.spec_for(mode=mode, sink_tokens=sinks)
    model, eos, pad = hub.models[0], hub.src_dict.eos(), hub.src_dict.pad()
    sample = _sample(hub, filler, "niah_single_3", 3 * TRAIN_LEN, 0.4)
    query = sample.queries[0]
    prompt = torch.cat([sample.context, query.question])
    candidates = [*query.answers, *query.distractors[:3]]
    scores, written = probe_module.answer_query(model, prompt, candidates, 6, spec, eos, pad)
    source = torch.cat([prompt.new_tensor([eos]), prompt])
    assert torch.equal(written, continue_ids(model, source, 6 + probe_module.GREEDY_SLACK, eos, pad, temperature=0.0,
                                             spec=spec))
    with torch.no_grad():
        logits, _ = model(torch.cat([source, written])[None, :-1], spec=spec)
    logits[..., pad] = float("-inf")
    assert torch.equal(logits[0, prompt.numel():].argmax(-1), written)
    for i, cand in enumerate(candidates):
        with torch.no_grad():
            logits, _ = model(torch.cat([source, cand])[None, :-1], spec=spec)
        expected = logits[0, -cand.numel():].double().log_softmax(-1).gather(-1, cand[:, None]).sum()
        # fp32 logits summed in other orders: about 1e-6 nats a token, over candidates of up to ~30 tokens
        assert float(scores.logprob[i]) == pytest.approx(float(expected), abs=1e-6 * cand.numel() + 1e-5), (i, mode)
    # the context read once for several questions (niah_multiquery): the same ids and scores, twice from one context
    from lex_plugin.evaluation.passkey import read_context

    context = read_context(model, sample.context, spec, eos)
    for _ in range(2):
        shared, shared_written = probe_module.answer_query(model, query.question, candidates, 6, spec, eos, pad, context)
        assert torch.equal(shared_written, written) and torch.equal(shared.greedy, scores.greedy), mode
        torch.testing.assert_close(shared.logprob, scores.logprob, rtol=0, atol=1e-5)


def test_a_forked_state_and_its_source_continue_apart(hub):
    """fork_incremental_state copies every cache: the fork continued by greedy decoding and then its source by other,
    sampled tokens, each holds the keys of a fresh read of its own tokens (1e-5), not the other's (the two write the
    same buffer rows if they share buffers); continue_ids refuses a state that already holds the whole prompt."""
    from lex_plugin.evaluation.passkey import read_prompt
    from lex_plugin.generation import continue_ids
    from lex_plugin.modules.attention.kv_cache import fork_incremental_state

    model, eos, pad, spec = hub.models[0], hub.src_dict.eos(), hub.src_dict.pad(), hub.spec_for(mode="full")
    prompt = hub.encode_fragment("The cat sat on the mat . " * 20)
    read = read_prompt(model, prompt, spec, eos)
    fork = fork_incremental_state(read.state)
    greedy = continue_ids(model, read.source[0], 10, eos, pad, temperature=0.0, incremental_state=fork, spec=spec)
    sampled = continue_ids(model, read.source[0], 10, eos, pad, temperature=1.0, generator=torch.Generator().manual_seed(0),
                           incremental_state=read.state, spec=spec)
    assert not torch.equal(greedy, sampled)
    for state, written in ((fork, greedy), (read.state, sampled)):  # each holds its prompt and written[:-1]
        fresh = read_prompt(model, torch.cat([prompt, written]), spec, eos).state
        assert len(state) == len(fresh) == LAYERS
        for key, cache in state.items():
            assert cache.end == fresh[key].end == read.source.size(1) + 9
            torch.testing.assert_close(cache.held().keys, fresh[key].held().keys, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="leave the prompt's last token out"):
        continue_ids(model, read.source[0, :-1], 2, eos, pad, incremental_state=fork_incremental_state(fork))
    with pytest.raises(TypeError, match="only a lex_lm's key/value caches fork"):
        fork_incremental_state({"x": torch.zeros(1)})


def test_a_model_that_cannot_see_the_needle_scores_at_chance(hub, filler):
    """Under a sliding window W = l each layer reaches l - 1 positions back (the bit-exact bound of the passkey
    tests): with the needle at depth 0.05 of a 512-token prompt it is out of every query's reach, so the true
    value is one of 10 exchangeable candidates. 100 trials land within the 99.9% binomial interval of 0.1."""
    length, trials = 8 * TRAIN_LEN, 100
    reach = LAYERS * (TRAIN_LEN - 1)
    for seed in range(3):  # (ruler_accuracy draws with its own seeds; these check the geometry of such prompts)
        s = _sample(hub, filler, "niah_single_1", length, 0.05, seed)
        assert s.tokens - s.needles[0][1] > reach + 1
    window = hub.spec_for(mode="sliding")
    [result] = ruler_accuracy(hub.models[0], hub.encode_fragment, filler, ["niah_single_1"], [length], [0.05], [window],
                              hub.src_dict.eos(), hub.src_dict.pad(), trials=trials, progress=False)
    sd = math.sqrt(0.1 * 0.9 / trials)
    assert abs(result.accuracy - 0.1) < 3.3 * sd, result.accuracy
    assert result.queries == trials and result.greedy == 0  # a 7-digit value it cannot see is never written whole


def test_lex_ruler_and_ruler_data(trained, data_bin, tmp_path, hub):
    """lex ruler writes its table, JSON (the prompt token counts included) and one heat map per task; lex
    ruler-data writes a data-bin of prompts followed by their answers, at most --max-length tokens each."""
    ckpt, _ = trained
    out = tmp_path / "ruler.json"
    proc = run_cli([sys.executable, "-m", "lex_plugin.cli", "ruler", str(data_bin), "--path", str(ckpt), "--tasks",
                    "niah_single_2,vt,fwe", "--lengths", f"{TRAIN_LEN * 4},{TRAIN_LEN * 8}", "--depths", "0.5", "--windows",
                    "full,bca", "--trials", "1", "--json", str(out), "--plot", str(tmp_path / "ruler.png")])
    assert "| niah_single_2 | full |" in proc.stdout and "| fwe | bca(32) |" in proc.stdout
    report = json.loads(out.read_text())
    assert len(report["results"]) == 3 * 2 * 2 and all(0 < r["tokens"] <= r["length"] for r in report["results"])
    assert all(r["prompt_tokens"] == [r["tokens"]] for r in report["results"])  # one trial: its prompt's count
    assert proc.stdout.index("greedy exact match") < proc.stdout.index("RULER-lite ranking")  # greedy first
    assert all(r["queries"] >= 1 and 0 <= r["greedy"] <= r["queries"] and r["greedy_rate"] == r["greedy"] / r["queries"]
               for r in report["results"])
    summary = {(s["window"], s["measure"], s["relative"]) for s in report["summary"]}
    assert summary == {(w, m, rel) for w in ("full", "bca(32)") for m in ("greedy", "ranking") for rel in (None, 0.9)}
    assert "| full | greedy |" in proc.stdout and "effective (0.856)" in proc.stdout
    assert all((tmp_path / f"ruler_{t}.png").stat().st_size > 5000 for t in ("niah_single_2", "vt", "fwe"))

    dest = tmp_path / "ruler-bin"
    run_cli([sys.executable, "-m", "lex_plugin.cli", "ruler-data", "--path", str(ckpt), str(data_bin), str(dest),
             "--samples", "16", "--max-length", str(8 * TRAIN_LEN - 1)])  # (this small BPE's frames need > l tokens)
    from fairseq.data import data_utils

    ds = data_utils.load_indexed_dataset(str(dest / "train"), hub.src_dict)
    assert len(ds) == 16 and max(ds.sizes) <= 8 * TRAIN_LEN  # with </s>
    assert (dest / "dict.txt").is_file()
    import numpy as np

    answers = np.load(dest / "train.answers.npy")  # each row's answer text and nothing before it
    assert answers.shape == (16,) and all(hub.decode(ds[i][-int(a) - 1:-1].long()).endswith(".") for i, a in enumerate(answers))
    assert all("?" not in hub.decode(ds[i][-int(a) - 1:-1].long()) for i, a in enumerate(answers))


def test_finetuning_samples_end_with_their_answers(hub, filler):
    rows = finetune_samples(hub.encode_fragment, filler, ["niah_single_1", "niah_multivalue", "vt"], 6, 8 * TRAIN_LEN - 1,
                            unk=hub.src_dict.unk())
    assert len(rows) == 6 and all(r.tokens.numel() <= 8 * TRAIN_LEN - 1 for r in rows)
    first = hub.decode(rows[0].tokens)
    value = re.findall(NEEDLE_RE, first)[0][1]
    assert first.endswith(f"mentioned in the provided text is {value}.")
    assert hub.decode(rows[0].tokens[-rows[0].answer:]) == f"{value}."  # the row's answer: the value and its stop


def test_effective_length_and_weighted_averages_by_hand():
    """Two tasks, four lengths: the task average per length, RULER's weighted averages (weights 1..4 rising or
    falling with the length's rank) and the effective length, absolute and relative to the shortest length."""
    scores = {"a": [1.0, 0.9, 0.6, 0.9], "b": [0.8, 0.9, 0.8, 0.1]}  # averages 0.9, 0.9, 0.7, 0.5
    results = [RulerResult(task, "full", L, 0.5, trials=2, score=2 * v, queries=2, greedy=2 * v / 2)
               for task, values in scores.items() for L, v in zip((64, 128, 256, 512), values)]
    ranking = effective_length(results, "full", "ranking", threshold=0.856)
    assert ranking["averages"] == pytest.approx({64: 0.9, 128: 0.9, 256: 0.7, 512: 0.5})
    assert ranking["wavg_inc"] == pytest.approx((0.9 + 2 * 0.9 + 3 * 0.7 + 4 * 0.5) / 10)
    assert ranking["wavg_dec"] == pytest.approx((4 * 0.9 + 3 * 0.9 + 2 * 0.7 + 0.5) / 10)
    assert ranking["effective_length"] == 128
    relative = effective_length(results, "full", "ranking", relative=0.75)  # bar 0.675: 256 passes, 512 does not
    assert relative["threshold"] == pytest.approx(0.675) and relative["effective_length"] == 256
    assert effective_length(results, "full", "ranking", threshold=0.95)["effective_length"] is None
    greedy = effective_length(results, "full", "greedy", threshold=0.3)  # half of each ranking score
    assert greedy["averages"][64] == pytest.approx(0.45) and greedy["effective_length"] == 256
    with pytest.raises(ValueError, match="unknown RULER measure"):
        effective_length(results, "full", "exact")
    # a length that fails ends the effective length, even where a longer one passes again
    dip = [RulerResult("a", "full", L, 0.5, trials=2, score=2 * v, queries=2, greedy=v)
           for L, v in zip((64, 128, 256, 512), (0.9, 0.7, 0.95, 0.95))]
    assert effective_length(dip, "full", "ranking", threshold=0.856)["effective_length"] == 64


def test_effective_length_judges_each_average_as_the_table_writes_it(tmp_path):
    """An average of 0.8564 is written "0.856" and does not exceed RULER's 0.856, though its raw value does; 0.8565 is
    written "0.857" and does. The relative bar is the factor times the shortest length's average as written, on
    decimals, at 4 decimals (0.9 x 0.857 = 0.7713; 0.75 x 0.071 = 0.05325 -> 0.0533, not the binary product's 0.0532),
    written beside the effective length; a window whose averages stay at its shortest length's, however small, keeps
    every length. A bar with more decimals than an average is written at is refused, by the table and by the CLI
    before the probe runs."""
    from lex_plugin.evaluation.ruler import format_ruler

    def results(*averages):
        return [RulerResult("a", "full", L, 0.5, trials=1, score=v, queries=1, greedy=v)
                for L, v in zip((64, 128, 256), averages)]

    assert effective_length(results(0.8565, 0.8564, 0.9), "full", "ranking")["effective_length"] == 64
    assert effective_length(results(0.8564, 0.9, 0.9), "full", "ranking")["effective_length"] is None
    own = effective_length(results(0.8565, 0.7715, 0.7714), "full", "ranking", relative=0.9)
    assert own["threshold"] == 0.7713 and own["effective_length"] == 128  # 0.7715 is "0.772", 0.7714 is "0.771"
    # 0.75 x 0.071 = 0.05325 -> 0.0533, where the binary product 0.0532499... gives 0.0532: 0.053 does not exceed it
    tie = effective_length(results(0.071, 0.053, 0.053), "full", "ranking", relative=0.75)
    assert tie["threshold"] == 0.0533 and tie["effective_length"] == 64
    assert effective_length(results(0.003, 0.003, 0.003), "full", "ranking", relative=0.9)["effective_length"] == 256
    table = format_ruler(results(0.8565, 0.8564, 0.9))
    assert "| full | ranking | 0.857 | 0.856 | 0.900 |" in table and "| 64 | 256 (bar 0.7713) |" in table
    for bad in (0.8555, 1.5):
        with pytest.raises(ValueError, match="at most 3 decimals"):
            effective_length(results(0.9, 0.9, 0.9), "full", "ranking", threshold=bad)
        with pytest.raises(ValueError, match="at most 3 decimals"):
            format_ruler(results(0.9, 0.9, 0.9), threshold=bad)
    # the CLI refuses it before reading the checkpoint (an empty file here)
    from click.testing import CliRunner

    from lex_plugin.cli import main

    (tmp_path / "empty.pt").touch()
    result = CliRunner().invoke(main, ["ruler", str(tmp_path), "--path", str(tmp_path / "empty.pt"), "--threshold", "0.8555"])
    assert result.exit_code == 1 and "at most 3 decimals" in result.output, result.output


def test_the_cli_defaults_are_the_probes():
    """`lex ruler` writes its bars' defaults as literals (the CLI module does not import the probe when it loads); they
    must be the probe's own: RULER's threshold (and its help names it) and the relative factor of ``format_ruler``."""
    import inspect

    from lex_plugin.cli.probes import ruler_cmd
    from lex_plugin.evaluation.ruler import format_ruler

    options = {p.name: p for p in ruler_cmd.params}
    assert options["threshold"].default == probe_module.RULER_THRESHOLD
    assert f"RULER's {probe_module.RULER_THRESHOLD}" in options["threshold"].help
    assert options["relative_threshold"].default == inspect.signature(format_ruler).parameters["relative"].default


def test_a_later_trial_too_long_for_its_length_is_redrawn(hub, filler, monkeypatch):
    """A prompt that does not fit is drawn again (trial 1's first draw here): the cell keeps all its trials; a cell
    that never fits keeps none and says why."""
    real = probe_module.make_sample
    calls = []

    def flaky(task, *args, **kwargs):
        calls.append(task)
        if task == "niah_single_1" and len(calls) == 2:  # trial 1, first draw
            raise ValueError("a prompt of this task needs more tokens; length 256 is too short.")
        if task == "vt":
            raise ValueError("length 256 is too short.")
        return real(task, *args, **kwargs)

    monkeypatch.setattr(probe_module, "make_sample", flaky)
    monkeypatch.setattr(probe_module, "answer_query", _oracle(hub))
    single, vt = ruler_accuracy(hub.models[0], hub.encode_fragment, filler, ["niah_single_1", "vt"], [4 * TRAIN_LEN], [0.5],
                                [hub.spec], hub.src_dict.eos(), hub.src_dict.pad(), trials=3, progress=False)
    assert single.trials == 3 and single.skipped is None and calls.count("niah_single_1") == 4
    assert vt.trials == 0 and "too short" in vt.skipped and calls.count("vt") == probe_module.REDRAWS


def test_a_killed_probe_resumes_at_its_first_unfinished_cell(hub, filler, tmp_path, monkeypatch):
    """A probe killed after two of its four cells, run again on the same journal: the two finished cells are read
    back (no query of theirs is asked again), a line the kill cut short is dropped, and the results equal an
    uninterrupted run's in every field. A journal signed for another probe is started afresh."""
    from lex_plugin.evaluation.journal import CellJournal

    specs = [hub.spec_for(mode="full"), hub.spec_for(mode="bca")]
    args = (hub.models[0], hub.encode_fragment, filler, ["niah_single_1", "vt"], [4 * TRAIN_LEN, 8 * TRAIN_LEN], [0.5], specs,
            hub.src_dict.eos(), hub.src_dict.pad())
    asked = []
    real = probe_module.answer_query

    def counted(model, prompt, *rest, **kw):
        asked.append(prompt.numel())
        if kill_after is not None and len(asked) > kill_after:
            raise KeyboardInterrupt
        return real(model, prompt, *rest, **kw)

    monkeypatch.setattr(probe_module, "answer_query", counted)
    kill_after = None
    reference = ruler_accuracy(*args, trials=1, progress=False)
    per_cell = len(asked) // 4  # one query per prompt of both tasks, two windows
    assert len(asked) == 8 and per_cell == 2

    path, signature = tmp_path / "ruler.json.cells.jsonl", {"checkpoint": "a", "trials": 1}
    asked.clear()
    kill_after = 2 * per_cell + 1  # dies within the third cell
    with pytest.raises(KeyboardInterrupt):
        ruler_accuracy(*args, trials=1, progress=False, journal=CellJournal(path, signature))
    with path.open("a") as f:
        f.write('{"key": ["vt", 256')  # the write a kill cut short
    asked.clear()
    kill_after = None
    journal = CellJournal(path, signature)
    assert len(journal) == 2
    resumed = ruler_accuracy(*args, trials=1, progress=False, journal=journal)
    assert len(asked) == 2 * per_cell  # the two unfinished cells only
    assert [r.to_dict() for r in resumed] == [r.to_dict() for r in reference]
    assert len(CellJournal(path, signature)) == 4 and len(CellJournal(path, {**signature, "trials": 2})) == 0
