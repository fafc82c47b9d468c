"""Generation and scoring through the hub interface and `lex generate`, on the small real-text model."""

import sys

import pytest
import torch

from conftest import TRAIN_LEN, run_cli
import lex_plugin
from lex_plugin import LexLanguageModel
from lex_plugin.hub_interface import filter_logits

PROMPT = "It was the best of times, it was the worst of times, and the door opened"


def test_text_round_trips_through_the_corpus_tokenization(hub):
    text = "It was the best of times, it was the worst of times."
    tokens = hub.encode(text)
    assert tokens[-1] == hub.src_dict.eos() and not tokens.eq(hub.src_dict.unk()).any()
    assert hub.decode(tokens) == text


@pytest.mark.parametrize("mode", ["full", "bca", "sliding"])
def test_greedy_generation_equals_the_parallel_argmax(hub, mode):
    """Prompt in one pass, then 3l tokens one at a time through the (bounded) cache: every generated token
    is the argmax of an independent parallel forward over the same sequence under the same window."""
    spec = hub.spec_for(mode=mode)
    generated = hub.continue_tokens(PROMPT, max_len=3 * TRAIN_LEN, temperature=0, spec=spec)
    prompt = hub.encode(PROMPT)[:-1]
    sequence = torch.cat([prompt.new_tensor([hub.src_dict.eos()]), prompt, generated])
    with torch.no_grad():
        logits, _ = hub.models[0](sequence[None], spec=spec)
    logits[..., hub.src_dict.pad()] = float("-inf")
    predicted = logits[0, prompt.numel() : -1].argmax(-1)
    assert generated.numel() == 3 * TRAIN_LEN
    assert torch.equal(predicted, generated)
    assert str(hub.window) == "full"  # the hub's own default is untouched


@pytest.mark.parametrize("mode", ["full", "bca"])
def test_sampled_generation_scores_equal_the_parallel_forward(hub, mode):
    """The suite's model greedily repeats one token, so argmax checks see little of the context: sample instead
    (temperature 1, seeded: many distinct tokens) and compare every step's logits through the (bounded) cache with
    one parallel forward over the same sequence (1e-4)."""
    from lex_plugin.generation import continue_ids

    spec, model, steps = hub.spec_for(mode=mode), hub.models[0], []

    def recording(tokens, **kwargs):
        out = model(tokens, **kwargs)
        steps.append(out[0][0, -1].float().clone())  # (the sampler masks <pad> in place afterwards)
        return out

    prompt = hub.encode(PROMPT)[:-1]
    prompt = torch.cat([prompt.new_tensor([hub.src_dict.eos()]), prompt])
    generated = continue_ids(recording, prompt, 3 * TRAIN_LEN, hub.src_dict.eos(), hub.src_dict.pad(), temperature=1.0,
                             generator=torch.Generator().manual_seed(3), spec=spec)
    assert generated.unique().numel() >= 40  # a continuation that depends on its context
    with torch.no_grad():
        logits, _ = model(torch.cat([prompt, generated])[None], spec=spec)
    parallel = logits[0, prompt.numel() - 1 : -1].float()  # the logits each generated token was drawn from
    assert (torch.stack(steps) - parallel).abs().max() <= 1e-4 and len(steps) == generated.numel() == 3 * TRAIN_LEN


def test_sampling_is_seeded_and_filtered(hub):
    a = hub.continue_text(PROMPT, max_len=20, temperature=1.0, top_p=0.9, seed=3)
    b = hub.continue_text(PROMPT, max_len=20, temperature=1.0, top_p=0.9, seed=3)
    assert a == b and a
    assert torch.equal(hub.continue_tokens(PROMPT, max_len=10, top_k=1, seed=5), hub.continue_tokens(PROMPT, max_len=10, temperature=0))


def test_filter_logits_top_k_and_top_p():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.isinf(filter_logits(logits, top_k=2)).tolist() == [False, False, True, True]
    assert torch.isinf(filter_logits(logits, top_p=0.6)).tolist() == [False, False, True, True]
    assert torch.isinf(filter_logits(logits, top_p=0.1)).tolist() == [False, True, True, True]
    assert torch.isinf(filter_logits(logits[[3, 1, 0, 2]], top_p=0.85)).tolist() == [True, False, False, False]


def test_fairseq_sample_and_score_with_bca(hub):
    bca = hub.under(hub.spec_for(mode="bca"))
    prompt_len = len(bca.encode(PROMPT))  # fairseq's length limits count the prompt
    text = bca.sample(PROMPT, beam=2, max_len_b=prompt_len + 12, min_len=prompt_len + 1)
    assert text.startswith(PROMPT) and len(text) > len(PROMPT)
    batch = bca.sample([PROMPT, "The night"], beam=2, max_len_b=3 * TRAIN_LEN, min_len=2 * TRAIN_LEN)
    assert batch[0].startswith("It was the best of times") and batch[1].startswith("The night")
    assert all(len(bca.encode(t)) > 2 * TRAIN_LEN for t in batch)  # past the training length, BCA cache
    scored = bca.score("It was the best of times.")
    tokens = bca.encode("It was the best of times.")
    source = torch.cat([tokens.new_tensor([bca.src_dict.eos()]), tokens[:-1]])
    with torch.no_grad():
        logits, _ = bca.models[0](source[None])
    expected = torch.log_softmax(logits[0].float(), -1).gather(-1, tokens[:, None])[:, 0]
    # fairseq's LM scoring strips the sentence's final </s> before scoring
    assert scored["positional_scores"].numel() == tokens.numel() - 1
    assert torch.allclose(scored["positional_scores"], expected[:-1], atol=1e-4)


def test_bad_prompts_are_explained(hub):
    with pytest.raises(ValueError, match="empty prompt"):
        hub.continue_text("   ")
    with pytest.raises(ValueError, match="none of the symbols"):
        hub.continue_text("\u2d63\u2d63 \u02ac\u02ac")


def test_bca_needs_a_training_length(trained, data_bin, tmp_path):
    ckpt, _ = trained
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    del state["cfg"]["model"]["tokens_per_sample"]
    torch.save(state, tmp_path / "no_length.pt")
    with pytest.raises(ValueError, match="records no tokens_per_sample"):
        lex_plugin.from_pretrained(tmp_path, "no_length.pt", data_bin, window="bca")
    hub = lex_plugin.from_pretrained(tmp_path, "no_length.pt", data_bin, window="bca", training_length=TRAIN_LEN)
    assert str(hub.window) == f"bca({TRAIN_LEN // 2})"


def test_the_class_method_loader_is_removed_with_an_error_that_names_the_loader():
    """Removed in 0.2: an error naming lex_plugin.from_pretrained, not fairseq's inherited loader (which would drop
    the attention keywords)."""
    with pytest.raises(TypeError, match=r"lex_plugin\.from_pretrained\(\.\.\.\) with the same arguments"):
        LexLanguageModel.from_pretrained("checkpoints", "checkpoint_best.pt", "data-bin", window="bca", sink_tokens=2)


def test_the_hubs_score_document_names_where_it_moved():
    from lex_plugin.hub_interface import LexHubInterface

    with pytest.raises(AttributeError, match=r"evaluation\.documents\.score_document\(hub, text, \.\.\.\)"):
        LexHubInterface.score_document(object(), "It was a dark and stormy night.")


def test_lex_generate_cli(trained, data_bin):
    ckpt, _ = trained
    base = [sys.executable, "-m", "lex_plugin.cli", "generate", str(data_bin), "--path", str(ckpt)]
    out = run_cli(base + ["--prompt", PROMPT, "--prompt", "The night", "--bca", "--max-len", "40", "--top-p", "0.9", "--seed", "1"]).stdout
    lines = [line for line in out.splitlines() if line.strip()]
    assert lines[0].startswith(PROMPT) and len(lines[0]) > len(PROMPT) + 10 and lines[1].startswith("The night")
    beam = run_cli(base + ["--prompt", "The night", "--beam", "3", "--max-len", "10"]).stdout
    assert beam.strip().startswith("The night") and len(beam.strip()) > len("The night") + 5
    import subprocess

    bad = subprocess.run(base + ["--prompt", " ", "--bca"], capture_output=True, text=True)
    assert bad.returncode != 0 and "empty prompt" in bad.stderr
    # the data-bin as --data, the form before the one convention: the same text, and a deprecation message
    old = run_cli([sys.executable, "-m", "lex_plugin.cli", "generate", "--path", str(ckpt), "--data", str(data_bin),
                   "--prompt", "The night", "--beam", "3", "--max-len", "10"])
    assert old.stdout == beam and "--data is deprecated" in old.stderr
    both = subprocess.run(base + ["--data", str(data_bin), "--prompt", "x"], capture_output=True, text=True)
    assert both.returncode != 0 and "given twice" in both.stderr


def test_lex_generate_refuses_sampling_options_it_would_ignore(trained, data_bin):
    """Beam search and greedy decoding (--temperature 0) draw nothing: a top-k, top-p or seed given with them is
    refused, naming it; the same values at their defaults, or with sampling, pass."""
    from click.testing import CliRunner

    from lex_plugin.cli import main

    ckpt, _ = trained
    base = ["generate", str(data_bin), "--path", str(ckpt), "--prompt", "The night", "--max-len", "3"]
    for extra, named in [(["--beam", "2", "--top-k", "5"], "--top-k"), (["--beam", "2", "--temperature", "0.7"], "--temperature"),
                         (["--beam", "2", "--seed", "1"], "--seed"), (["--temperature", "0", "--top-p", "0.5"], "--top-p"),
                         (["--temperature", "0", "--seed", "3"], "--seed")]:
        result = CliRunner().invoke(main, base + extra)
        assert result.exit_code == 2 and named in result.output, (extra, result.output)
    for extra in (["--temperature", "0"], ["--beam", "2"], ["--top-k", "5", "--seed", "1"]):
        result = CliRunner().invoke(main, base + extra)
        assert result.exit_code == 0, (extra, result.output)
