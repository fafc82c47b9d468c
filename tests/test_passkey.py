"""lex passkey: prompt construction, scoring through the cache against a parallel reference, and the
exact check that a key out of every query's reach cannot change the scores."""

import json
import sys

import pytest
import torch

from conftest import REPO, TRAIN_LEN, run_cli
from lex_plugin.evaluation.passkey import DIGITS, QUESTION, build_prompt, finetune_samples, score_candidates

LAYERS = 4  # lex_lm_tiny


@pytest.fixture(scope="module")
def encode(hub):
    return hub.encode_fragment


def _candidates(encode, keys):
    return [encode(" ".join(f"{k:05d}")) for k in keys]


def test_prompt_has_the_length_and_the_needle_at_its_depth(encode, filler, hub):
    for depth in (0.0, 0.5, 1.0):
        prompt = build_prompt(encode, filler, 300, depth, 4711)
        assert prompt.tokens.numel() == 300
        needle = hub.decode(prompt.tokens[prompt.needle_start : prompt.needle_end])
        assert needle == "The pass key is 0 4 7 1 1. Remember it. 0 4 7 1 1 is the pass key."
    early, late = (build_prompt(encode, filler, 300, d, 1) for d in (0.1, 0.9))
    assert early.needle_start < late.needle_start
    with pytest.raises(ValueError, match="fractions of the context"):
        build_prompt(encode, filler, 300, 1.5, 1)
    with pytest.raises(ValueError, match="too short"):
        build_prompt(encode, filler, 20, 0.5, 1)


@pytest.mark.parametrize("mode", ["full", "bca"])
def test_candidate_scores_equal_a_parallel_forward_per_candidate(hub, encode, filler, mode):
    """The prompt through the (bounded) cache, the candidates as one reordered batch == each full sequence
    in one parallel forward, log-probabilities summed in float64 (1e-5 nats: the two paths add fp32 logits in
    different orders, which moves a sum of about 60 nats by about 1e-6 with one thread)."""
    window = hub.spec_for(mode=mode)
    model = hub.models[0]
    prompt = build_prompt(encode, filler, 5 * TRAIN_LEN, 0.3, 12345)
    cands = _candidates(encode, [12345, 80085, 67890])
    assert len({c.numel() for c in cands}) > 1  # this small BPE splits some digits: ragged candidates
    got = score_candidates(model, prompt.tokens, cands, window, hub.src_dict.eos(), hub.src_dict.pad())
    eos = prompt.tokens.new_tensor([hub.src_dict.eos()])
    for i, cand in enumerate(cands):
        seq = torch.cat([eos, prompt.tokens, cand])
        with torch.no_grad():
            logits, _ = model(seq[None, :-1], spec=window)
        lp = logits[0, -cand.numel():].double().log_softmax(-1).gather(-1, cand[:, None]).sum()
        assert float(got.logprob[i]) == pytest.approx(float(lp), abs=1e-5)


@pytest.mark.parametrize("mode, limit", [("full", None), ("bca", None), ("sliding", None), ("full", 300), ("bca", 300)])
def test_candidates_share_the_prompts_one_cache_and_leave_it_as_it_was(hub, encode, filler, mode, limit, monkeypatch):
    """The N candidates read the prompt's cache through views (no N-row copy of it stays in the state), score as
    copies of the prompt would (N reordered rows, the path before), and leave the cache as it was: scored twice, the
    same scores. With xPos's centre allowed only ``limit`` positions (fp16 allows about 2k), the candidates move
    their own centre beyond the prompt's, as the copies re-centre theirs."""
    from lex_plugin.evaluation.passkey import read_prompt, score_continuations
    from lex_plugin.modules.positions import XPos

    if limit is not None:
        monkeypatch.setattr(XPos, "max_center_offset", lambda self, dtype, scaling=None: limit)
    window = hub.spec_for(mode=mode)
    model = hub.models[0]
    # with the limit, a prompt whose end leaves the candidates too little room from its centre: they move theirs to
    # the next multiple of the centre step (lengths found for l = 64 and xPos's 256-position centre step)
    tokens = build_prompt(encode, filler, 5 * TRAIN_LEN, 0.6, 24680).tokens if limit is None else \
        filler[: {"full": 1067, "bca": 300}[mode]]
    cands = _candidates(encode, [24680, 13579, 11111, 99999])
    read = read_prompt(model, tokens, window, hub.src_dict.eos())
    if limit is not None:
        step = model.decoder.positions[0].center_step
        assert all(c.end + 3 - c.center > limit and c.end // step * step != c.center for c in read.state.values())
    before = {key: (c.end, c.held().keys.clone(), c.held().values.clone()) for key, c in read.state.items()}
    first = score_continuations(model, read, cands, window, hub.src_dict.pad())
    for key, cache in read.state.items():  # untouched: batch 1, the same positions, keys and values
        end, keys, values = before[key]
        assert cache.end == end and torch.equal(cache.held().keys, keys) and torch.equal(cache.held().values, values)
    again = score_continuations(model, read, cands, window, hub.src_dict.pad())
    assert torch.equal(first.logprob, again.logprob) and torch.equal(first.greedy, again.greedy)
    # the path before: the prompt's cache copied to N rows (reorder), then continued
    copied = read_prompt(model, tokens, window, hub.src_dict.eos())
    n, m = len(cands), max(c.numel() for c in cands)
    rows = torch.full((n, m), hub.src_dict.pad())
    for i, c in enumerate(cands):
        rows[i, : c.numel()] = c
    model.decoder.reorder_incremental_state_scripting(copied.state, torch.zeros(n, dtype=torch.long))
    with torch.no_grad():
        logits, _ = model(torch.cat([copied.source.expand(n, -1), rows[:, :-1]], 1), incremental_state=copied.state,
                          spec=window)
    steps = logits[:, -m:].double().log_softmax(-1).gather(-1, rows[:, :, None]).squeeze(-1)
    reference = steps.masked_fill(rows.eq(hub.src_dict.pad()), 0.0).sum(-1)
    torch.testing.assert_close(first.logprob, reference, rtol=0, atol=1e-5)


@pytest.mark.parametrize("mode", ["full", "bca"])
def test_greedy_flags_equal_greedy_decoding(hub, encode, filler, mode):
    """CandidateScores.greedy against decoding itself: six tokens appended one at a time, each the argmax of a
    parallel forward over everything so far. A candidate is flagged exactly when it is a prefix of that
    continuation: its first three and all six tokens are, the six with the last or the first token changed and
    a key are not."""
    window = hub.spec_for(mode=mode)
    model = hub.models[0]
    prompt = build_prompt(encode, filler, 3 * TRAIN_LEN, 0.4, 2718)
    seq = torch.cat([prompt.tokens.new_tensor([hub.src_dict.eos()]), prompt.tokens])
    with torch.no_grad():
        for _ in range(6):
            logits, _ = model(seq[None], spec=window)
            seq = torch.cat([seq, logits[0, -1].argmax()[None]])
    written = seq[-6:]
    other = (written[-1] + 1) % len(hub.src_dict)
    cands = [written[:3], written, torch.cat([written[:-1], other[None]]), torch.cat([other[None], written[1:]]),
             *_candidates(encode, [31415])]
    got = score_candidates(model, prompt.tokens, cands, window, hub.src_dict.eos(), hub.src_dict.pad())
    expected = [c.numel() <= 6 and torch.equal(c, written[:c.numel()]) for c in cands]
    assert expected[:4] == [True, True, False, False]
    assert got.greedy.tolist() == expected
    assert got.greedy.dtype == torch.bool and got.logprob.dtype == torch.float64
    assert not got.logprob.requires_grad  # scored without an autograd graph


@pytest.mark.parametrize("mode", ["bca", "sliding"])
def test_a_key_beyond_every_querys_reach_cannot_change_the_scores(hub, encode, filler, mode):
    """Under BCA or a sliding window W = l each layer reaches at most l - 1 positions back, so the candidates
    (after position L) depend only on the last LAYERS (l - 1) prompt tokens. With the needle at the start of
    a 1024-token prompt, two different hidden keys give exactly the same candidate scores; under full
    attention they do not."""
    length = 1024
    reach = LAYERS * (TRAIN_LEN - 1)
    keys = [31337, 13337, 80085, 24680]
    lengths = [c.numel() for c in _candidates(encode, keys)]
    assert lengths[0] == lengths[1]  # the same number of tokens: the prompts differ only inside the needle
    a, b = (build_prompt(encode, filler, length, 0.0, key) for key in keys[:2])
    differ = (a.tokens != b.tokens).nonzero().flatten()
    assert differ.numel() > 0 and a.needle_start <= int(differ.min()) and int(differ.max()) < a.needle_end == b.needle_end
    assert length - a.needle_end > reach + 1
    cands = _candidates(encode, keys)
    ids = hub.src_dict.eos(), hub.src_dict.pad()
    window = hub.spec_for(mode=mode)
    assert torch.equal(score_candidates(hub.models[0], a.tokens, cands, window, *ids).logprob,
                       score_candidates(hub.models[0], b.tokens, cands, window, *ids).logprob)
    full = hub.spec_for(mode="full")
    assert not torch.equal(score_candidates(hub.models[0], a.tokens, cands, full, *ids).logprob,
                           score_candidates(hub.models[0], b.tokens, cands, full, *ids).logprob)


def test_lex_passkey_writes_table_json_and_heat_map(trained, data_bin, tmp_path):
    ckpt, _ = trained
    out = run_cli([sys.executable, "-m", "lex_plugin.cli", "passkey", "--path", str(ckpt), str(data_bin),
                   "--lengths", f"{2 * TRAIN_LEN},{4 * TRAIN_LEN}", "--depths", "0.2,0.8", "--trials", "2",
                   "--windows", "full,bca", "--json", str(tmp_path / "p.json"), "--plot", str(tmp_path / "p.png")])
    report = json.loads((tmp_path / "p.json").read_text())
    cells = {(r["window"], r["length"], r["depth"]) for r in report["results"]}
    assert cells == {(w, L, d) for w in ("full", f"bca({TRAIN_LEN // 2})") for L in (2 * TRAIN_LEN, 4 * TRAIN_LEN) for d in (0.2, 0.8)}
    assert all(r["trials"] == 2 and 0 <= r["accuracy"] <= 1 for r in report["results"])
    assert "| depth | 128 (2l) | 256 (4l) |" in out.stdout
    assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_lengths_the_split_cannot_fill_are_refused(trained, data_bin):
    from click.testing import CliRunner

    from lex_plugin.cli import main as lex_cli

    ckpt, _ = trained
    result = CliRunner().invoke(lex_cli, ["passkey", "--path", str(ckpt), str(data_bin), "--lengths", "10000000",
                                          "--depths", "0.5", "--trials", "1"])
    assert result.exit_code != 0 and "need more" in result.output


def test_finetuning_samples_are_prompts_followed_by_their_key(encode, filler):
    question = encode(QUESTION)
    samples = finetune_samples(encode, filler, 30, 150, seed=3)
    assert len(samples) == 30 and all(s.tokens.numel() <= 150 for s in samples)
    assert len({s.tokens.numel() for s in samples}) > 5  # lengths vary
    q = question.tolist()
    for row in samples:
        s = row.tokens.tolist()
        # ... What is the pass key ? The pass key is | 7 1 4 3 2: the key's tokens follow the question
        end = max(i + len(q) for i in range(len(s) - len(q) + 1) if s[i : i + len(q)] == q)
        key = s[end:]
        assert len(key) >= DIGITS, key  # one token per digit at least (digits are space-separated)
        assert row.answer == len(key)
        # the needle states the same key twice, the first time followed by " ." (so the tail is the whole key)
        runs = [i for i in range(end - len(key) + 1) if s[i : i + len(key)] == key]
        assert len(runs) >= 2 and min(b - a for a, b in zip(runs, runs[1:])) < 20, runs
        assert s[runs[0] + len(key)] == encode(".")[-1].item()
    with pytest.raises(ValueError, match="too short"):
        finetune_samples(encode, filler, 1, 40)
    with pytest.raises(ValueError, match="need more"):
        finetune_samples(encode, filler[:100], 1, 150)


def test_lex_passkey_data_writes_a_data_bin_fairseq_fine_tunes_on(trained, data_bin, tmp_path, encode):
    ckpt, _ = trained
    dest = tmp_path / "passkey-bin"
    dest.mkdir()  # an existing empty DEST is taken (written under DEST.partial, then renamed over it)
    out = run_cli([sys.executable, "-m", "lex_plugin.cli", "passkey-data", "--path", str(ckpt), str(data_bin), str(dest),
                   "--samples", "24", "--max-length", "127"])
    assert "24 passkey samples" in out.stdout and not (tmp_path / "passkey-bin.partial").exists()
    assert (dest / "dict.txt").read_bytes() == (data_bin / "dict.txt").read_bytes()
    from fairseq.data import Dictionary, data_utils

    dataset = data_utils.load_indexed_dataset(str(dest / "train"), Dictionary.load(str(dest / "dict.txt")))
    items = [dataset[i].long() for i in range(len(dataset))]
    eos = Dictionary.load(str(dest / "dict.txt")).eos()
    assert len(items) == 24 and all(int(t[-1]) == eos and t.numel() <= 128 for t in items)
    assert all(encode(QUESTION).tolist() in [t[i : i + encode(QUESTION).numel()].tolist() for i in range(t.numel())]
               for t in items)
    # one row per sample at --tokens-per-sample 128: fairseq fine-tunes the checkpoint on it
    save = tmp_path / "ft"
    run_cli(["fairseq-train", str(dest), "--user-dir", str(REPO / "lex_plugin"), "--task", "language_modeling",
             "--arch", "lex_lm_tiny", "--share-decoder-input-output-embed", "--tokens-per-sample", "128",
             "--sample-break-mode", "eos", "--batch-size", "8", "--optimizer", "adam", "--lr", "1e-4", "--max-update", "2",
             "--finetune-from-model", str(ckpt), "--save-dir", str(save), "--no-epoch-checkpoints", "--disable-validation",
             "--num-workers", "0"])
    assert (save / "checkpoint_last.pt").exists()
    _answer_only_loss_is_the_answers_nll(dest, items, ckpt, encode)
    with pytest.raises(AssertionError, match="not empty"):
        run_cli([sys.executable, "-m", "lex_plugin.cli", "passkey-data", "--path", str(ckpt), str(data_bin), str(dest)])


def _task(data, *flags):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(options.get_training_parser(), [
        str(data), "--user-dir", str(REPO / "lex_plugin"), "--task", "lex_language_modeling", "--arch", "lex_lm_tiny",
        "--tokens-per-sample", "128", *flags])
    cfg = convert_namespace_to_omegaconf(args)
    return tasks.setup_task(cfg.task), cfg


def _answer_only_loss_is_the_answers_nll(dest, items, ckpt, encode):
    """--answer-only-loss: each sample's targets are padding but for the row's key and its </s>, and fairseq's
    cross-entropy over a batch equals the mean NLL of exactly those tokens under one plain forward per row
    (float64 reference). Refused without the answer lengths or with another break mode."""
    import numpy as np
    from fairseq import checkpoint_utils

    answers = np.load(dest / "train.answers.npy")
    assert answers.shape == (len(items),) and all(a >= DIGITS for a in answers)
    task, cfg = _task(dest, "--sample-break-mode", "eos", "--answer-only-loss")
    task.load_dataset("train")
    dataset = task.dataset("train")
    pad = task.dictionary.pad()
    for i in range(len(items)):
        target = dataset[i]["target"]
        kept = target.ne(pad)
        assert kept.sum() == answers[i] + 1 and torch.equal(target[kept], items[i][-(int(answers[i]) + 1):])
        assert torch.equal(dataset[i]["source"][1:], items[i][:-1])  # the prompt is still read
    (model,), _ = checkpoint_utils.load_model_ensemble([str(ckpt)], task=task)
    model.eval()
    batch = dataset.collater([dataset[i] for i in range(6)])
    assert batch["ntokens"] == int(sum(answers[:6]) + 6)
    loss, sample_size, _ = task.build_criterion(cfg.criterion)(model, batch, reduce=True)
    nll = []
    with torch.no_grad():
        for row, a in zip(items[:6], answers[:6]):
            logits, _ = model(torch.cat([row.new_tensor([task.dictionary.eos()]), row[:-1]])[None])
            lp = logits[0].double().log_softmax(-1).gather(-1, row[:, None]).squeeze(-1)
            nll += (-lp[-(int(a) + 1):]).tolist()
    assert sample_size == len(nll) and loss.item() / sample_size == pytest.approx(sum(nll) / len(nll), rel=1e-5)
    # the task's criterion projects the answers' positions alone: fairseq's cross_entropy's loss and gradients
    from fairseq.criterions.cross_entropy import CrossEntropyCriterion

    from lex_plugin.criterions import AnswerCrossEntropyCriterion

    criterion = task.build_criterion(cfg.criterion)
    assert isinstance(criterion, AnswerCrossEntropyCriterion)
    got = []
    for crit in (criterion, CrossEntropyCriterion(task, sentence_avg=False)):
        model.zero_grad()
        loss, sample_size, log = crit(model, batch)
        loss.backward()
        got.append((loss.item(), sample_size, log["ntokens"], [p.grad.clone() for p in model.parameters()]))
    (ours, size, ntokens, grads), (theirs, size_ref, ntokens_ref, grads_ref) = got
    assert (size, ntokens) == (size_ref, ntokens_ref) and ours == pytest.approx(theirs, rel=1e-6)
    for g, ref in zip(grads, grads_ref):
        torch.testing.assert_close(g, ref, rtol=1e-4, atol=1e-7)
    with torch.no_grad():  # a loss per position (reduce=False): fairseq's shape and values, padding included
        per_position, _, _ = criterion(model, batch, reduce=False)
        ref_per_position, _, _ = CrossEntropyCriterion(task, sentence_avg=False)(model, batch, reduce=False)
    assert per_position.shape == ref_per_position.shape == batch["target"].view(-1).shape
    torch.testing.assert_close(per_position, ref_per_position)
    np.save(dest / "train.answers.npy", answers[:-1])  # the lengths of other rows
    task, _ = _task(dest, "--sample-break-mode", "eos", "--answer-only-loss")
    with pytest.raises(ValueError, match="belongs to other rows"):
        task.load_dataset("train")
    longer = answers.copy()
    longer[1] = len(items[1])  # an answer as long as its whole row: with its </s>, one more target than the row has
    np.save(dest / "train.answers.npy", longer)
    task, _ = _task(dest, "--sample-break-mode", "eos", "--answer-only-loss")
    task.load_dataset("train")
    task.dataset("train")[0]  # the other rows still read
    with pytest.raises(ValueError, match=f"row 1 has {len(items[1])} targets and an answer of {len(items[1])} tokens"):
        task.dataset("train")[1]
    np.save(dest / "train.answers.npy", answers)
    task, _ = _task(dest, "--sample-break-mode", "none", "--answer-only-loss")
    with pytest.raises(ValueError, match="needs --sample-break-mode eos"):
        task.load_dataset("train")
    (dest / "train.answers.npy").rename(dest / "moved.npy")
    task, _ = _task(dest, "--sample-break-mode", "eos", "--answer-only-loss")
    with pytest.raises(FileNotFoundError, match="lex passkey-data or lex ruler-data"):
        task.load_dataset("train")
    (dest / "moved.npy").rename(dest / "train.answers.npy")


@pytest.mark.parametrize("depth", [0.0, 0.5, 1.0])
def test_the_needle_sits_exactly_at_its_depth(depth):
    """build_prompt puts round(depth * F) filler tokens between the intro and the needle (F = the filler
    tokens of the prompt): offset exactly |intro| + round(depth F), the filler in order around it."""
    vocab = {}
    encode = lambda text: torch.tensor([vocab.setdefault(w, 1000 + len(vocab)) for w in text.split()])  # noqa: E731
    filler = torch.arange(10, 500)
    prompt = build_prompt(encode, filler, 200, depth, 31337)
    from lex_plugin.evaluation.passkey import INTRO, NEEDLE, QUESTION, _spell

    intro, needle, question = encode(INTRO), encode(NEEDLE.format(key=_spell(31337))), encode(QUESTION)
    fill = 200 - intro.numel() - needle.numel() - question.numel()
    cut = {0.0: 0, 0.5: round(0.5 * fill), 1.0: fill}[depth]
    assert prompt.tokens.numel() == 200
    assert prompt.needle_start == intro.numel() + cut and prompt.needle_end == prompt.needle_start + needle.numel()
    assert torch.equal(prompt.tokens[: intro.numel()], intro)
    assert torch.equal(prompt.tokens[prompt.needle_start : prompt.needle_end], needle)
    assert torch.equal(prompt.tokens[intro.numel() : prompt.needle_start], filler[:cut])
    assert torch.equal(prompt.tokens[prompt.needle_end : 200 - question.numel()], filler[cut:fill])
