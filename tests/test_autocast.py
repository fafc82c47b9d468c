"""bf16 autocast (``--bf16-autocast``, ``LexLanguageModel.with_autocast``): logits of every position scheme within
a stated bound of fp32's, xPos finite at 64k, a few updates that move the weights as fp32's do, fairseq-train /
fairseq-eval-lm / the hub / ``lex score`` under it, and the refusals. Where the CPU has no native bf16 the tests
run it emulated (LEX_EMULATED_BF16=1): the same numbers, slowly."""

import json
import math
import re
import sys

import pytest
import torch

from conftest import REPO, TRAIN_LEN, build_lex_model, make_dictionary, random_tokens, run_cli
from lex_plugin.modules import autocast as autocast_module
from lex_plugin.modules.attention import AttentionSpec, AttentionWindow

SCHEMES = ["xpos", "rope", "alibi", "sandwich", "smoothed_sandwich", "kerple_log", "kerple_power", "t5", "sinusoidal",
           "learned", "none"]
L = 64
# bf16 keeps 8 bits of mantissa: |log p| errors of a few 1e-2 over a 100-word vocabulary (measured 0.01-0.03)
LOGPROB_BOUND = 0.1


@pytest.fixture
def emulated_bf16(monkeypatch):
    monkeypatch.setenv(autocast_module.EMULATED_BF16_ENV, "1")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_logits_under_autocast_stay_within_a_bound_of_fp32(scheme, emulated_bf16):
    """At l and 16l (l only for learned positions): the view's logits are bf16 (autocast ran) and their
    log-probabilities within LOGPROB_BOUND of the fp32 model's; the model itself is untouched (fp32 logits,
    bitwise as before)."""
    d = make_dictionary()
    model = build_lex_model(dictionary=d, pos_emb=scheme, tokens_per_sample=L, seed=1)
    view = model.with_autocast(torch.bfloat16)
    for length in ([L] if scheme == "learned" else [L, 16 * L]):
        tokens = random_tokens(d, 2, length, seed=length)
        with torch.no_grad():
            ref = model(tokens)[0]
            got = view(tokens)[0]
            again = model(tokens)[0]
        assert ref.dtype == torch.float32 and got.dtype == torch.bfloat16
        assert torch.equal(ref, again) and next(model.parameters()).dtype == torch.float32
        err = (torch.log_softmax(got.float(), -1) - torch.log_softmax(ref, -1)).abs().max().item()
        assert 0 < err < LOGPROB_BOUND, (scheme, length, err)


@pytest.mark.parametrize("scheme", ["xpos", "alibi"])
@pytest.mark.parametrize("window", ["bca_sinks", "sliding", "rerope"])
def test_windows_sinks_and_position_maps_under_autocast(scheme, window, emulated_bf16):
    """The executor's other paths under autocast (sink tokens, batched windows, a position map's log-sum-exp
    merge): bf16 logits within LOGPROB_BOUND of fp32's at 8l."""
    from lex_plugin.modules.attention import AttentionOptions

    d = make_dictionary()
    model = build_lex_model(dictionary=d, pos_emb=scheme, tokens_per_sample=L, seed=4)
    mode = {"bca_sinks": "bca", "sliding": "sliding", "rerope": "rerope"}[window]
    spec = AttentionOptions(mode, sink_tokens=4 if window == "bca_sinks" else None).spec(L, 8 * L)
    tokens = random_tokens(d, 2, 8 * L, seed=5)
    with torch.no_grad():
        ref = model(tokens, spec=spec)[0]
        got = model.with_autocast(torch.bfloat16)(tokens, spec=spec)[0]
    assert got.dtype == torch.bfloat16
    err = (torch.log_softmax(got.float(), -1) - torch.log_softmax(ref, -1)).abs().max().item()
    assert 0 < err < LOGPROB_BOUND, (scheme, window, err)


def test_token_by_token_under_autocast_equals_one_forward(emulated_bf16):
    """Generation through the bounded cache with sink tokens under autocast: each step's logits equal the parallel
    forward's within bf16 rounding (measured 0.016)."""
    from lex_plugin.modules.attention import AttentionOptions

    d = make_dictionary()
    model = build_lex_model(dictionary=d, pos_emb="xpos", tokens_per_sample=L, seed=4).with_autocast(torch.bfloat16)
    spec = AttentionOptions("bca", sink_tokens=4).spec(L, 4 * L)
    tokens = random_tokens(d, 1, 2 * L, seed=1)
    with torch.no_grad():
        parallel = model(tokens, spec=spec)[0]
        state = {}
        steps = torch.cat([model(tokens[:, :i], incremental_state=state, spec=spec)[0][:, -1:] for i in range(1, 2 * L + 1)], 1)
    assert steps.dtype == torch.bfloat16 and (parallel.float() - steps.float()).abs().max() < 0.05


def test_xpos_stays_finite_at_64k_under_autocast(emulated_bf16):
    """65,536 tokens (1024 l) through a one-layer xPos model under bf16 autocast with BCA (l = 64): every logit
    finite, and the last block's logits those of the same tokens at the start of a sequence."""
    d = make_dictionary()
    model = build_lex_model(dictionary=d, pos_emb="xpos", tokens_per_sample=L, decoder_embed_dim=32,
                            decoder_attention_heads=2, decoder_ffn_embed_dim=64, decoder_layers=1).with_autocast(torch.bfloat16)
    tokens = random_tokens(d, 1, 65536, seed=3)
    spec = AttentionSpec(AttentionWindow.bca(L))
    with torch.no_grad():
        logits = model(tokens, spec=spec)[0]
        tail = model(tokens[:, -2 * L:], spec=spec)[0]
    assert logits.shape == (1, 65536, len(d)) and torch.isfinite(logits.float()).all()
    # one layer under BCA: the last l/2 queries see the last l tokens only, so the last 2l tokens alone (the same
    # block boundaries) give the same logits: xPos at position 65,000 as at 100, within bf16's rounding
    assert (logits[:, -L // 2:].float() - tail[:, -L // 2:].float()).abs().max() < 0.05


def test_a_few_updates_under_autocast_move_the_weights_as_fp32_does(real_batches, emulated_bf16):
    """Five AdamW steps on real text from the same initialisation, fp32 and under bf16 autocast: the losses
    agree within 1%, and every parameter's update points the same way (cosine > 0.9 over the whole model)."""
    batches, d = real_batches
    runs = {}
    for precision in ("fp32", "bf16"):
        model = build_lex_model(dictionary=d, pos_emb="xpos", tokens_per_sample=L, seed=2, dropout=0.0)
        model.train()
        start = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        run = model.with_autocast(torch.bfloat16) if precision == "bf16" else model
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses = []
        for step in range(5):
            batch = batches[step * 8:(step + 1) * 8]
            logits = run(batch[:, :-1])[0]
            assert logits.dtype == (torch.bfloat16 if precision == "bf16" else torch.float32)
            loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
            opt.zero_grad()
            loss.backward()
            assert all(p.grad.dtype == torch.float32 for p in model.parameters() if p.grad is not None)
            opt.step()
            losses.append(loss.item())
        end = torch.cat([p.detach().flatten() for p in model.parameters()])
        runs[precision] = (losses, end - start, next(model.parameters()).dtype)
    (l32, u32, w32), (l16, u16, w16) = runs["fp32"], runs["bf16"]
    assert w32 == w16 == torch.float32
    assert all(abs(a - b) / a < 0.01 for a, b in zip(l32, l16)), (l32, l16)
    assert l16[-1] < l16[0] - 0.3  # it trained
    assert torch.nn.functional.cosine_similarity(u32, u16, dim=0) > 0.9


def test_autocast_refuses_what_it_cannot_do(monkeypatch):
    """Half-precision weights (--fp16 / --memory-efficient-fp16 / --bf16 cast the model), a device without
    native bf16, fp16 autocast: each a ValueError that says what to change."""
    d = make_dictionary()
    model = build_lex_model(dictionary=d, pos_emb="rope", tokens_per_sample=L)
    tokens = random_tokens(d, 1, 8)
    monkeypatch.setenv(autocast_module.EMULATED_BF16_ENV, "1")
    with pytest.raises(ValueError, match="drop --fp16 / --memory-efficient-fp16 / --bf16"):
        build_lex_model(dictionary=d, pos_emb="rope", tokens_per_sample=L).half().with_autocast(torch.bfloat16)(tokens)
    monkeypatch.delenv(autocast_module.EMULATED_BF16_ENV)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    with pytest.raises(ValueError, match="no native bf16"):
        model.with_autocast(torch.bfloat16)(tokens)
    with pytest.raises(ValueError, match="loss scaler"):
        model.with_autocast(torch.float16)


def test_fairseq_train_eval_and_lex_commands_under_autocast(data_bin, trained, tmp_path):
    """fairseq-train --task lex_language_modeling --bf16-autocast: 3 updates whose losses follow fp32's (1%),
    an fp32 checkpoint; fairseq-eval-lm --bf16-autocast (its length table within 1% of fp32's ppl) and
    ``lex score --bf16-autocast`` (within 0.5%) on the trained model; --memory-efficient-fp16 refused."""
    env = {"LEX_EMULATED_BF16": "1"}
    args = [str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "lex_language_modeling", "--arch", "lex_lm_tiny",
            "--share-decoder-input-output-embed", "--tokens-per-sample", str(TRAIN_LEN), "--sample-break-mode", "none",
            "--batch-size", "8", "--optimizer", "adam", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "2",
            "--max-update", "3", "--no-epoch-checkpoints", "--disable-validation", "--log-format", "json", "--log-interval", "1",
            "--num-workers", "0", "--seed", "1", "--dropout", "0"]
    curves = {}
    for name, extra in (("fp32", []), ("bf16", ["--bf16-autocast"])):
        proc = run_cli(["fairseq-train", *args, "--save-dir", str(tmp_path / name), *extra], env=env)
        curves[name] = [float(json.loads(m)["loss"]) for m in re.findall(r"train_inner \| (\{.*\})", proc.stdout + proc.stderr)]
    assert len(curves["fp32"]) == len(curves["bf16"]) == 3
    assert all(abs(a - b) / a < 0.01 for a, b in zip(curves["fp32"], curves["bf16"])), curves
    state = torch.load(tmp_path / "bf16" / "checkpoint_last.pt", map_location="cpu", weights_only=False)["model"]
    assert all(v.dtype == torch.float32 for k, v in state.items() if v.is_floating_point())

    ckpt = trained[0]
    reports = {}
    for name, extra in (("fp32", []), ("bf16", ["--bf16-autocast"])):
        out = tmp_path / f"{name}.json"
        run_cli(["fairseq-eval-lm", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "lex_language_modeling",
                 "--path", str(ckpt), "--gen-subset", "valid", "--tokens-per-sample", str(TRAIN_LEN),
                 "--eval-lengths", f"{TRAIN_LEN},{4 * TRAIN_LEN}", "--eval-windows", "full,bca", "--eval-tokens", "1024",
                 "--batch-size", "4", "--num-workers", "0", "--report-json", str(out), *extra], env=env)
        reports[name] = {(r["window"], r["length"]): r["ppl"] for r in json.loads(out.read_text())["results"]}
    assert reports["fp32"].keys() == reports["bf16"].keys() and len(reports["fp32"]) == 4
    for key, ppl in reports["fp32"].items():
        assert 0 < abs(reports["bf16"][key] - ppl) / ppl < 0.01, (key, ppl, reports["bf16"][key])

    text = tmp_path / "doc.txt"
    text.write_text("It was the best of times, it was the worst of times, it was the age of wisdom.\n")
    scores = {}
    for name, extra in (("fp32", []), ("bf16", ["--bf16-autocast"])):
        out = tmp_path / f"score_{name}.json"
        run_cli([sys.executable, "-m", "lex_plugin.cli", "score", str(data_bin), str(text), "--path", str(ckpt),
                 "--bca", "--json", str(out), *extra], env=env)
        scores[name] = json.loads(out.read_text())["ppl"]
    assert 0 < abs(scores["bf16"] - scores["fp32"]) / scores["fp32"] < 0.005, scores
    with pytest.raises(AssertionError, match="drop --fp16 / --memory-efficient-fp16 / --bf16"):
        run_cli(["fairseq-train", *args, "--save-dir", str(tmp_path / "half"), "--bf16-autocast", "--memory-efficient-fp16",
                 "--max-update", "1"], env=env)


@pytest.mark.parametrize("mode", ["bca", "bca_sinks", "sliding_sinks", "rerope"])
@pytest.mark.parametrize("scheme", ["xpos", "alibi"])
def test_attention_under_autocast_is_bf16_attention_bitwise(mode, scheme):
    """The contract of the attention core under bf16 autocast: it equals, bitwise and in bf16, the same attention
    run without autocast on bf16 queries, keys and values (a model of that dtype): rotation, biases and softmax
    statistics are computed as the bf16 model computes them, never in autocast's own precision."""
    from lex_plugin.modules.attention import AttentionOptions, HeldKeys, attend, dense_query_limit, plan
    from lex_plugin.modules.positions import ALiBi, XPos

    B, H, D, T = 2, 4, 16, 4 * L + 5
    options = {"bca": AttentionOptions("bca"), "bca_sinks": AttentionOptions("bca", sink_tokens=4),
               "sliding_sinks": AttentionOptions("sliding", "l", sink_tokens=3), "rerope": AttentionOptions("rerope")}[mode]
    spec = options.spec(L, T)
    pos = XPos(D) if scheme == "xpos" else ALiBi(H)
    torch.manual_seed(9)
    q, k, v = (torch.randn(B, H, T, D) for _ in range(3))

    def run(q, k, v):
        chunks = plan(spec.window, q_len=T, has_bias=True, padded=False, batch_heads=B * H,
                      local_positions=pos.translation_invariant, dense_queries=dense_query_limit(pos, torch.bfloat16, None))
        return attend(q, HeldKeys(k, v), chunks, spec=spec, scheme=pos)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = run(q, k, v)
    expected = run(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert got.dtype == expected.dtype == torch.bfloat16
    assert torch.equal(got, expected), (got.float() - expected.float()).abs().max()


@pytest.mark.parametrize("keys", [700, 3000], ids=["fp32-copies", "per-head"])
@pytest.mark.parametrize("extra", ["plain", "alibi+padding", "learned-sinks", "peaked"])
def test_one_bf16_query_over_a_cache_view_equals_float64_attention(extra, keys, monkeypatch):
    """A generation step's one bf16 query over a bf16 cache on CPU (the softmax in fp32; the products in fp32 on copies
    up to HALF_STEP_FP32_KEYS keys, per head in bf16 over the cache's (S, D) rows beyond) equals float64 attention
    over the same bf16 values within bf16 rounding; an ALiBi bias with padded keys, and learned sink logits, too. Where
    attention is peaked (queries 3x: logits of std ~3) the per-head products' one rounding of the logits to bf16
    shows: within 8x the error of SDPA's fused kernel (fp32 logits) on the same inputs (measured 6.0x over 3,000 keys:
    2.15e-2 against 3.6e-3; 4.8x over 700, on outputs of magnitude ~1), the price of the 3x faster step over long
    caches. Over fewer keys (fp32 products) the step is within 2x of the fused kernel's error."""
    from lex_plugin.modules.attention import HeldKeys, attend, plan
    from lex_plugin.modules.attention.kernels import ops
    from lex_plugin.modules.positions import ALiBi, NoPositions, alibi_slopes

    per_head = []
    original = ops.per_head_products
    monkeypatch.setattr(ops, "per_head_products", lambda a, b: per_head.append(1) or original(a, b))
    torch.manual_seed(2)
    B, H, D, S, cap = 2, 4, 32, keys, keys + 324
    buffer_k, buffer_v = torch.randn(2, B, H, cap, D, dtype=torch.bfloat16)  # a cache's buffers: rows cap apart
    k, v = buffer_k[:, :, 100 : 100 + S], buffer_v[:, :, 100 : 100 + S]
    q = (torch.randn(B, H, 1, D) * (3.0 if extra == "peaked" else 1.0)).bfloat16()
    window, bias = AttentionWindow.full(), extra == "alibi+padding"
    pad = torch.zeros(B, S, dtype=torch.bool)
    pad[1, :57] = True
    sinks = torch.randn(H) if extra == "learned-sinks" else None
    held = HeldKeys(k, v, pad if bias else None, center=0)
    got = attend(q, held, plan(window, q_start=S - 1, q_len=1, has_bias=bias, padded=bias), spec=AttentionSpec(window),
                 scheme=ALiBi(H) if bias else NoPositions(), q_start=S - 1, sink_logits=sinks)
    logits = q.double() @ k.double().transpose(-1, -2) / math.sqrt(D)
    if bias:
        logits = logits + torch.tensor(alibi_slopes(H), dtype=torch.float64)[:, None, None] * -torch.arange(
            S - 1, -1, -1, dtype=torch.float64)
        logits = logits.masked_fill(pad[:, None, None, :], float("-inf"))
    if sinks is not None:
        logits = torch.cat([sinks.double()[None, :, None, None].expand(B, H, 1, 1), logits], -1)
        expected = torch.softmax(logits, -1)[..., 1:] @ v.double()
    else:
        expected = torch.softmax(logits, -1) @ v.double()
    assert got.dtype == torch.bfloat16
    assert bool(per_head) == (S > ops.HALF_STEP_FP32_KEYS)
    err = (got.double() - expected).abs().max()
    if extra == "peaked":
        fused = torch.nn.functional.scaled_dot_product_attention(q, k, v).double()
        assert err <= (8 if per_head else 2) * (fused - expected).abs().max()
    else:  # measured 0.9e-3 / 3.4e-3 / 0.8e-3; SDPA's fused bf16 kernel on the same inputs 0.5e-3 / 3.4e-3 / 0.6e-3
        assert err < (5e-3 if bias else 2e-3)


def test_generation_opens_one_autocast_region(emulated_bf16, monkeypatch):
    """continue_ids under an autocast view opens one autocast region around all its steps (the fp32 weights are
    cast to bf16 once per generation, not at every step), and the tokens are those of per-step calls."""
    from lex_plugin.generation import continue_ids
    from lex_plugin.modules import decoder as decoder_module

    d = make_dictionary()
    model = build_lex_model(dictionary=d, pos_emb="xpos", tokens_per_sample=L, seed=4).with_autocast(torch.bfloat16)
    prompt = random_tokens(d, 1, 20, seed=1)[0]
    opened = []
    real = decoder_module.autocast
    monkeypatch.setattr(decoder_module, "autocast", lambda *args: opened.append(args) or real(*args))
    with torch.no_grad():
        generated = continue_ids(model, prompt, 6, d.eos(), d.pad(), temperature=0.0)
        assert len(opened) == 1
        state, tokens = {}, prompt[None]
        for _ in range(6):  # each step its own region
            logits = model(tokens, incremental_state=state)[0]
            tokens = torch.cat([tokens, logits[:, -1].float().argmax(-1, keepdim=True)], 1)
    assert len(opened) == 7 and torch.equal(generated, tokens[0, 20:])


@pytest.mark.parametrize("pattern", ["rope/sliding:16,none/full", "rope/chunked:16,none/full"])
def test_a_training_batch_with_a_one_query_window_backpropagates_under_autocast(pattern, emulated_bf16):
    """A batch of 65 tokens under windows of 16 leaves one query in the last window: under bf16 autocast with gradients
    it keeps SDPA (a generation step's per-head products write into preallocated rows, which autograd refuses), and its
    gradients are those of fp32 within bf16 rounding."""
    d = make_dictionary()
    model = build_lex_model(dictionary=d, pos_emb="rope", layer_pattern=pattern, tokens_per_sample=L, seed=3)
    tokens = random_tokens(d, 2, 65, seed=2)
    grads = []
    for view in (model, model.with_autocast(torch.bfloat16)):
        model.zero_grad()
        view(tokens)[0].float().logsumexp(-1).mean().backward()
        grads.append(model.decoder.layers[0].self_attn.q_proj.weight.grad.clone())
    assert torch.isfinite(grads[1]).all()
    assert (grads[1] - grads[0]).norm() <= 0.05 * grads[0].norm()
