"""lex_plugin.experiments.reproduce and scripts/reproduce.py: the tables and claim verdicts from known
reports, the step commands, and one tiny resumable run on real text through fairseq-train,
fairseq-eval-lm and lex resolution."""

import dataclasses
import json
import os
import shutil
import sys

import pytest
import torch

from conftest import REPO, run_cli
from lex_plugin.experiments import reproduce

L = 32


def report(rows):
    """An eval-lm --report-json holding {(window label, length): ppl}, each row with its structured fields."""
    return {"results": [{"window": w, "attention": {"mode": w.split("(")[0]}, "length": n, "protocol": "stream", "ppl": p}
                        for (w, n), p in rows.items()]}


def resolution(r_full, r_bca):
    return {"full": {"lengths": {str(2 * L): {"R": r_full}}}, "bca": {"lengths": {str(2 * L): {"R": r_bca}}}}


LENGTHS = [L, 2 * L, 4 * L, 8 * L]


def paper_like():
    """Reports shaped like the paper's claims: LeX+BCA flat, RoPE exploding, ALiBi slightly worse."""
    return {
        "xpos": report({("bca(16)", n): 30.0 - i for i, n in enumerate(LENGTHS)} | {("full", n): 30.0 * (i + 1) for i, n in enumerate(LENGTHS)}),
        "rope": report({("full", n): 30.0 * 10 ** i for i, n in enumerate(LENGTHS)}),
        "alibi": report({("full", n): 31.0 for n in LENGTHS}),
    }


def test_ppl_table_reads_the_window_mode_field():
    ppl = reproduce.ppl_table(paper_like())
    assert set(ppl["xpos"]) == {"bca", "full"}
    assert ppl["xpos"]["bca"][2 * L] == 29.0


def test_claims_hold_on_paper_like_numbers():
    ppl = reproduce.ppl_table(paper_like())
    claims = reproduce.check_claims(ppl, {"xpos": resolution(0.10, 0.20)}, L, LENGTHS)
    assert len(claims) == 4
    assert all(c["holds"] for c in claims), claims


def test_claims_fail_when_the_numbers_say_so():
    reports = paper_like()
    reports["xpos"]["results"] += report({("bca(16)", 16 * L): 45.0})["results"]
    reports["rope"] = report({("full", n): 30.0 + i for i, n in enumerate(LENGTHS + [16 * L])})  # RoPE extrapolates
    reports["alibi"] = report({("full", n): 20.0 for n in LENGTHS + [16 * L]})  # ALiBi better at 4l+
    ppl = reproduce.ppl_table(reports)
    claims = reproduce.check_claims(ppl, {"xpos": resolution(0.20, 0.10)}, L, LENGTHS + [16 * L])
    assert len(claims) == 4
    assert not any(c["holds"] for c in claims), claims
    assert "16: 45.00" not in claims[0]["numbers"]  # formatted with the length first
    assert f"{16 * L}: 45.00" in claims[0]["numbers"]


def test_claims_are_judged_on_their_numbers_as_written():
    """A perplexity that rises by less than its last written decimal does not rise as written (30.004 is "30.00"), one
    that rises by half of it does (30.005 is "30.01", half up); LeX + BCA equal to ALiBi as written is at or below it;
    resolutions are judged at their 4 written decimals. Judging the raw numbers fails the first claim and the
    resolution's."""
    reports = paper_like()
    reports["xpos"] = report({("bca(16)", n): 30.0 + 0.004 * (i > 0) for i, n in enumerate(LENGTHS)})
    reports["alibi"] = report({("full", n): 30.0 for n in LENGTHS})
    flat = {"xpos": resolution(0.12339, 0.12341)}  # both "0.1234": BCA does not exceed as written
    claims = {c["claim"].split(":")[0]: c for c in reproduce.check_claims(reproduce.ppl_table(reports), flat, L, LENGTHS)}
    assert claims["LeX + BCA"]["holds"] and claims["LeX + BCA"]["numbers"] == f"{L}: 30.00, " + ", ".join(
        f"{n}: 30.00" for n in LENGTHS[1:])
    assert claims["LeX + BCA at or below ALiBi (full attention) at 4l and beyond"]["holds"]
    assert not claims["xPos"]["holds"] and claims["xPos"]["numbers"] == "BCA 0.1234 vs full 0.1234"
    reports["xpos"] = report({("bca(16)", n): 30.0 + 0.005 * (i > 0) for i, n in enumerate(LENGTHS)})
    (rises, *_) = reproduce.check_claims(reproduce.ppl_table(reports), {}, L, LENGTHS)
    assert not rises["holds"] and f"{2 * L}: 30.01" in rises["numbers"]
    # the resolution table writes R as the claim reads it (0.87615 is "0.8762", half up); a resolution that is not
    # finite gives no claim rather than stopping the table
    assert "0.8762" in reproduce.markdown_resolution({"xpos": resolution(0.87615, 0.5)}, ["xpos"], [2 * L])
    claims = reproduce.check_claims(reproduce.ppl_table(reports), {"xpos": resolution(float("nan"), 0.5)}, L, LENGTHS)
    assert not any(c["claim"].startswith("xPos") for c in claims)


def magnitude_reports(rope16, sinusoidal16, xpos16, alibi16):
    """Reports at l..16l whose ppl(16l) / ppl(l) are the given ratios (every ppl at l is 10; ALiBi's ratio is its own)."""
    lengths = LENGTHS + [16 * L]

    def rows(window, last):
        return {(window, n): 10.0 * (last if n == 16 * L else 1.0) for n in lengths}
    return {"rope": report(rows("full", rope16)), "sinusoidal": report(rows("full", sinusoidal16)),
            "xpos": report(rows("bca(16)", xpos16)), "alibi": report(rows("full", alibi16))}, lengths


def test_magnitudes_hold_at_the_targets_and_give_the_paper_ratios():
    reports, lengths = magnitude_reports(3.0, 5.0, 1.0, 1.2)
    rows = reproduce.check_magnitudes(reproduce.ppl_table(reports), L, lengths)
    by = {(r["run"], r["window"]): r for r in rows}
    assert [k for k in by] == [("sinusoidal", "full"), ("rope", "full"), ("alibi", "full"), ("xpos", "bca")]
    assert by[("rope", "full")]["ratios"] == {2: 1.0, 4: 1.0, 8: 1.0, 16: 3.0}
    assert all(by[k]["holds"] for k in [("rope", "full"), ("sinusoidal", "full"), ("xpos", "bca")])
    assert by[("alibi", "full")]["holds"] is None and by[("alibi", "full")]["numbers"] == "10.00 -> 12.00"  # no target
    # the paper's ratios are its Table 2 perplexities (PG22) divided by the one at l = 1024
    assert by[("rope", "full")]["paper"][8] == pytest.approx(458.83 / 26.68, rel=1e-3)
    assert by[("sinusoidal", "full")]["paper"][8] == pytest.approx(12747.41 / 30.54, rel=1e-3)
    assert by[("xpos", "bca")]["paper"][8] == pytest.approx(24.89 / 26.59, rel=1e-3)
    text = reproduce.markdown_magnitudes(rows)
    assert "**no**" not in text and "| 417.40 |" in text


def test_magnitudes_missed_are_reported_missed():
    # just short of each target as the table writes it (2.99, 4.99, 1.01)
    reports, lengths = magnitude_reports(2.99, 4.99, 1.006, 1.2)
    rows = reproduce.check_magnitudes(reproduce.ppl_table(reports), L, lengths)
    assert [r["holds"] for r in rows] == [False, False, None, False]
    reports, lengths = magnitude_reports(9.0, 9.0, 0.9, 0.85)  # flat, but ALiBi lower still
    rows = reproduce.check_magnitudes(reproduce.ppl_table(reports), L, lengths)
    assert rows[-1]["holds"] is False and "ALiBi 8.50" in rows[-1]["numbers"]
    del reports["alibi"]  # LeX's verdict waits for ALiBi's number
    reports["sinusoidal"]["results"] += report({("full", 16 * L + L // 2): 99.0})["results"]
    rows = reproduce.check_magnitudes(reproduce.ppl_table(reports), L, lengths + [16 * L + L // 2])
    assert rows[-1]["holds"] is None and "ALiBi -" in rows[-1]["numbers"]
    assert set(rows[0]["ratios"]) == {2, 4, 8, 16} and rows[0]["ratios"][16] == pytest.approx(9.0)  # 16.5l: no column
    # without 16l there is no verdict, only the ratios
    rows = reproduce.check_magnitudes(reproduce.ppl_table(paper_like()), L, LENGTHS)
    assert {r["holds"] for r in rows} == {None} and rows[0]["ratios"][8] == 1000.0
    assert "| - | - |" in reproduce.markdown_magnitudes(rows)


def test_a_missed_magnitude_gives_the_tokens_its_power_law_reaches_the_target_at():
    # RoPE's ratio at 16l follows 0.5 * sqrt(updates / 25): 1.0, 1.41, 2.0, 2.83 at 100..800 updates of 1,000 tokens;
    # the law reaches 3 at 900 updates = 900,000 tokens
    ratio = {u: 0.5 * (u / 25) ** 0.5 for u in (100, 200, 400, 800)}
    budgets = {"rope": {u: {"full": {L: 10.0, 16 * L: 10.0 * r}} for u, r in ratio.items()}}
    ppl = {"rope": budgets["rope"][800]}
    (row,) = reproduce.check_magnitudes(ppl, L, [L, 16 * L], budgets, tokens_per_update=1000)
    assert row["holds"] is False
    assert row["trend"]["exponent"] == pytest.approx(0.5) and row["trend"]["points"] == 4
    assert row["trend"]["tokens"] == pytest.approx(900_000, rel=1e-9)
    assert "0.9M tokens (ratio ~ tokens^0.50, 4 points)" in reproduce.markdown_magnitudes([row])
    # falling with training: never; met: no trend; one point: no trend
    falling = {"rope": {u: {"full": {L: 10.0, 16 * L: 20.0 / u}} for u in (1, 2)}}
    (row,) = reproduce.check_magnitudes({"rope": falling["rope"][2]}, L, [L, 16 * L], falling, 1000)
    assert row["trend"]["tokens"] is None and "never" in reproduce.markdown_magnitudes([row])
    met = {"rope": {u: {"full": {L: 10.0, 16 * L: 40.0}} for u in (1, 2)}}
    assert reproduce.check_magnitudes({"rope": met["rope"][2]}, L, [L, 16 * L], met, 1000)[0]["trend"] is None
    # a missed upper bound (LeX + BCA above 1) has no trend to a target
    rising = {"xpos": {u: {"bca": {L: 10.0, 16 * L: 10.0 * r}} for u, r in ratio.items()}}
    (row,) = reproduce.check_magnitudes({"xpos": rising["xpos"][800], "alibi": {"full": {L: 9.0, 16 * L: 90.0}}},
                                        L, [L, 16 * L], rising, 1000)[-1:]
    assert row["run"] == "xpos" and row["holds"] is False and row["trend"] is None
    one = {"rope": {800: budgets["rope"][800]}}
    assert reproduce.check_magnitudes(ppl, L, [L, 16 * L], one, 1000)[0]["trend"] is None


def test_a_magnitude_is_judged_as_its_table_writes_it():
    """The magnitudes table writes ratios at 2 decimals and judges them as written: LeX + BCA from 10.00 to 10.03
    reads "1.00" against "<= 1" and holds; RoPE from 10.00 to 29.96 reads "3.00" against ">= 3" and holds (both read
    "**no**" beside those figures when judged on 1.003 and 2.996)."""
    ppl = {"xpos": {"bca": {L: 10.0, 16 * L: 10.03}}, "alibi": {"full": {L: 10.0, 16 * L: 11.0}},
           "rope": {"full": {L: 10.0, 16 * L: 29.96}}}
    rows = {r["run"]: r for r in reproduce.check_magnitudes(ppl, L, [L, 16 * L])}
    assert rows["xpos"]["holds"] and rows["rope"]["holds"]
    text = reproduce.markdown_magnitudes(list(rows.values()))
    assert "| 3.00 | 17.20 | >= 3 | yes |" in text and "| 1.00 | 0.94 | <= 1 and below ALiBi | yes |" in text
    ppl["rope"]["full"][16 * L] = 29.949  # 2.9949, written 2.99
    assert not reproduce.check_magnitudes(ppl, L, [L, 16 * L])[0]["holds"]
    ppl["rope"]["full"][16 * L] = float("inf")  # a model that diverged: judged and written as it is, not an error
    (row,) = [r for r in reproduce.check_magnitudes(ppl, L, [L, 16 * L]) if r["run"] == "rope"]
    assert row["holds"] and "| RoPE (Roformer) | full attention | inf |" in reproduce.markdown_magnitudes([row])


def test_missing_numbers_give_no_verdict():
    assert reproduce.check_claims({}, {}, L, LENGTHS) == []


def test_commands_load_this_repository_plugin(tmp_path):
    o = reproduce.ReproduceOptions(arch="lex_lm_tiny", training_length=L, max_update=3, batch_size=4, lr="1e-3", seed=1, lengths=LENGTHS,
             eval_tokens=512, resolution_texts=2)
    train = reproduce.train_command(tmp_path, tmp_path / "ckpt", ["--pos-emb", "xpos"], o)
    evaluate = reproduce.eval_command(tmp_path, tmp_path / "c.pt", LENGTHS, ["full", "bca"], tmp_path / "r.json", o)
    for cmd in (train, evaluate):
        assert str(cmd[cmd.index("--user-dir") + 1]) == str(REPO / "lex_plugin")
    assert train[train.index("--max-update") + 1] == "3" and "--pos-emb" in train  # the recipe's command: strings
    assert evaluate[evaluate.index("--eval-windows") + 1] == "full,bca"
    assert reproduce.resolution_command(tmp_path, tmp_path / "c.pt", [L], "bca", tmp_path / "o.json", o)[-1] == "--bca"
    assert "--bca" not in reproduce.resolution_command(tmp_path, tmp_path / "c.pt", [L], "full", tmp_path / "o.json", o)


def test_method_and_passkey_commands(tmp_path):
    o = reproduce.ReproduceOptions(arch="lex_lm_tiny", training_length=L, max_update=3, batch_size=4, lr="1e-3", seed=1, lengths=LENGTHS,
             eval_tokens=512, resolution_texts=2, passkey_trials=3)
    sinks = reproduce.method_command(tmp_path, tmp_path / "c.pt", "sliding_sinks", tmp_path / "r.json", o)
    assert sinks[sinks.index("--eval-windows") + 1] == "sliding" and sinks[sinks.index("--sink-tokens") + 1] == 4
    assert sinks[sinks.index("--eval-lengths") + 1] == ",".join(map(str, LENGTHS))
    yarn = reproduce.method_command(tmp_path, tmp_path / "c.pt", "yarn", tmp_path / "r.json", o)
    assert yarn[yarn.index("--rope-scaling") + 1] == "yarn" and yarn[yarn.index("--rope-scaling-factor") + 1] == "auto"
    logn = reproduce.method_command(tmp_path, tmp_path / "c.pt", "rerope_logn", tmp_path / "r.json", o)
    assert logn[logn.index("--eval-windows") + 1] == "rerope" and "--logn" in logn
    assert reproduce.methods_of("alibi", ["rerope", "leaky_rerope", "dca_logn"]) == ["rerope", "dca_logn"]
    bias = reproduce.passkey_command(tmp_path, tmp_path / "c.pt", tmp_path / "passkey.json", o, rotary=False)
    assert bias[bias.index("--windows") + 1] == "full,bca,sliding,lm_infinite,rerope,self_extend,dca"
    key = reproduce.passkey_command(tmp_path, tmp_path / "c.pt", tmp_path / "passkey.json", o)
    assert key[key.index("--windows") + 1].endswith(",dca,leaky_rerope")
    assert key[key.index("--lengths") + 1] == f"{L},{2 * L},{4 * L},{8 * L}" and key[key.index("--trials") + 1] == 3
    assert key[key.index("--plot") + 1] == tmp_path / "passkey.png"
    logn = reproduce.passkey_command(tmp_path, tmp_path / "c.pt", tmp_path / "p.json", o, rotary=False, extra=["--logn"])
    assert logn[logn.index("--windows") + 1] == "full,lm_infinite,rerope,self_extend,dca"  # BCA, sliding: log-n = 1
    prep = reproduce.passkey_data_command(tmp_path, tmp_path / "c.pt", tmp_path / "pk", o)
    assert prep[prep.index("--max-length") + 1] == L // 2 - 8 and "passkey-data" in prep
    tune = reproduce.finetune_command(tmp_path / "pk", tmp_path / "c.pt", tmp_path / "ft", ["--pos-emb", "alibi"], o)
    assert tune[tune.index("--finetune-from-model") + 1] == str(tmp_path / "c.pt") and tune[1] == str(tmp_path / "pk")
    assert tune[tune.index("--sample-break-mode") + 1] == "eos" and "--disable-validation" in tune
    assert tune[tune.index("--tokens-per-sample") + 1] == str(L) and tune[tune.index("--pos-emb") + 1] == "alibi"
    assert tune[tune.index("--save-interval-updates") + 1] == "100"  # a killed fine-tuning resumes (stamp: train.done)
    # RULER-lite: its data (l - 1 tokens), the fine-tuning as the passkey's, the probe over every window at l..8l
    data = reproduce.ruler_data_command(tmp_path, tmp_path / "c.pt", tmp_path / "rb", o)
    assert "ruler-data" in data and data[data.index("--max-length") + 1] == L - 1
    tune = reproduce.answer_finetune_command(tmp_path / "rb", tmp_path / "c.pt", tmp_path / "ft", ["--pos-emb", "rope"], o,
                                             reproduce.RULER_FINETUNE)
    assert tune[1] == str(tmp_path / "rb") and tune[tune.index("--finetune-from-model") + 1] == str(tmp_path / "c.pt")
    assert "--answer-only-loss" in tune and "--answer-only-loss" not in reproduce.finetune_command(
        tmp_path / "pk", tmp_path / "c.pt", tmp_path / "ft", [], o)  # the passkey recipe keeps the whole-prompt loss
    probe = reproduce.ruler_command(tmp_path, tmp_path / "c.pt", tmp_path / "ruler.json", o, rotary=False)
    assert probe[probe.index("--windows") + 1] == "full,bca,sliding,lm_infinite,rerope,self_extend,dca"
    assert probe[probe.index("--lengths") + 1] == f"{L},{2 * L},{4 * L},{8 * L}"
    assert reproduce.methods_of("alibi", ["ruler"]) == ["ruler"]
    # LongPPL: l, 4l, 16l under every probe window, the battery's thresholds, the table alone
    longppl = reproduce.longppl_command(tmp_path, tmp_path / "c.pt", tmp_path / "longppl.json", o)
    assert longppl[longppl.index("--eval-lengths") + 1] == f"{L},{4 * L},{16 * L}"
    assert longppl[longppl.index("--eval-windows") + 1] == "full,bca,sliding,lm_infinite,rerope,self_extend,dca,leaky_rerope"
    assert longppl[longppl.index("--longppl-alpha") + 1] == 0.5 and longppl[longppl.index("--longppl-beta") + 1] == 8
    assert "--longppl" in longppl and "--length-report-only" in longppl and "--key-token-model" not in longppl
    # BABILong-lite: qa1-qa3 stories below l from the training split, fine-tuned on the answers, probed at l..16l
    data = reproduce.babilong_data_command(tmp_path, tmp_path / "c.pt", tmp_path / "bb", o)
    assert "babilong-data" in data and data[data.index("--max-length") + 1] == L - 1
    assert data[data.index("--tasks") + 1] == "qa1,qa2,qa3" and "--split" not in data  # the training split, its default
    tune = reproduce.answer_finetune_command(tmp_path / "bb", tmp_path / "c.pt", tmp_path / "ft", ["--pos-emb", "alibi"], o,
                                             reproduce.BABILONG_FINETUNE)
    assert tune[1] == str(tmp_path / "bb") and "--answer-only-loss" in tune and tune[tune.index("--max-update") + 1] == "600"
    assert tune[tune.index("--save-interval-updates") + 1] == "100"
    probe = reproduce.babilong_command(tmp_path, tmp_path / "c.pt", tmp_path / "babilong.json", o, rotary=False)
    assert probe[probe.index("--lengths") + 1] == f"{L},{2 * L},{4 * L},{8 * L},{16 * L}"
    assert probe[probe.index("--windows") + 1] == "full,bca,sliding,lm_infinite,rerope,self_extend,dca"
    assert probe[probe.index("--tasks") + 1] == "qa1,qa2,qa3" and probe[probe.index("--plot") + 1] == tmp_path / "babilong.png"
    # the scaled probe: 8l only, full attention, the scaling's own flags with auto = 8 (its value at 8l)
    flags = reproduce.scaled_passkey_flags("llama3_logn")
    assert flags == ["--rope-scaling", "llama3", "--rope-scaling-factor", "8", "--logn"]
    scaled = reproduce.passkey_command(tmp_path, tmp_path / "c.pt", tmp_path / "p.json", o, extra=flags, lengths=[8 * L],
                                       windows=["full"])
    assert scaled[scaled.index("--lengths") + 1] == str(8 * L) and scaled[scaled.index("--windows") + 1] == "full"
    assert scaled[-5:] == flags


def test_trained_designs_take_the_probes_as_trained():
    from lex_plugin.experiments.reproduce.catalogue import methods_of

    asked = ["bca_sinks", "rerope", "passkey", "passkey_finetuned", "passkey_finetuned_logn", "passkey_finetuned_scaled",
             "ruler", "longppl", "babilong"]
    assert methods_of("rope_ssmax", asked) == ["passkey", "passkey_finetuned", "ruler", "longppl", "babilong"]
    assert methods_of("sinusoidal", asked) == []


def test_methods_run_on_xpos_rope_alibi_and_scaling_on_rotary_only():
    asked = ["yarn", "bca_sinks", "passkey", "linear", "passkey_finetuned"]
    assert reproduce.methods_of("rope", asked) == asked
    assert reproduce.methods_of("alibi", asked) == ["bca_sinks", "passkey", "passkey_finetuned"]
    assert reproduce.methods_of("sinusoidal", asked) == [] and reproduce.methods_of("xpos_random", asked) == []
    probes = ["passkey_finetuned_logn", "passkey_finetuned_scaled", "yarn_logn", "dca_logn"]
    assert reproduce.methods_of("rope", probes) == probes and reproduce.methods_of("alibi", probes) == ["passkey_finetuned_logn", "dca_logn"]


def test_passkey_and_method_tables():
    def cell(window, length, retrieved, trials=4):
        return {"window": window, "length": length, "depth": 0.5, "retrieved": retrieved, "trials": trials}

    passkey = {"xpos": {"results": [cell("full", L, 4), cell("full", 2 * L, 1), cell("full", 4 * L, 0),
                                    cell("bca(16)", L, 2), cell("bca(16)", 2 * L, 0)]}}
    table = reproduce.markdown_passkey(passkey, ["xpos", "rope"], L)
    assert "| LeX (xPos) | full | 1.00 | 0.25 | 0.00 | 0.12 |" in table  # beyond l: 1 of 8 trials
    assert "| LeX (xPos) | bca(16) | 0.50 | 0.00 | - | 0.00 |" in table
    assert "RoPE" not in table
    ppl = {"xpos": {"bca": {L: 30.0, 8 * L: 29.0}, "bca_sinks": {L: 30.0, 8 * L: 28.0}}, "rope": {"bca": {L: 31.0}}}
    text = reproduce.markdown_methods(ppl, ["xpos", "rope"], ["bca_sinks", "yarn"], [L, 8 * L], L)
    assert "#### BCA + 4 sinks" in text and "YaRN" not in text
    assert "| LeX (xPos) | BCA | 30.00 | 29.00 | 0.97 |" in text
    assert "| LeX (xPos) | BCA + 4 sinks | 30.00 | 28.00 | 0.93 |" in text


def test_tiny_run_end_to_end_and_resume(data_bin, tmp_path):
    work = tmp_path / "repro"
    args = [sys.executable, str(REPO / "scripts" / "reproduce.py"), "--work", str(work), "--data-bin", str(data_bin),
            "--runs", "xpos,xpos_scalar_zeta,xpos_random", "--max-update", "3", "--batch-size", "4", "--training-length", str(L),
            "--lengths", f"{L},{2 * L},{8 * L}", "--eval-tokens", "512", "--resolution-texts", "2",
            "--methods", "bca_sinks,yarn", "--in-process"]
    run_cli(args, timeout=600)
    tables = (work / "tables.md").read_text()
    for needle in ("LeX (xPos) | full attention", "LeX (xPos) | BCA", "LeX (xPos) | sliding window",
                   "xPos with one scalar zeta | BCA", "R at 32, full", "| **total** |"):
        assert needle in tables, (needle, tables)
    results = json.loads((work / "results.json").read_text())
    assert set(results["ppl"]) == {"xpos", "xpos_scalar_zeta", "xpos_random"}
    # its provenance: the steps' wall time summed, the seed of its options
    prov = results["provenance"]
    assert prov["wall_s"] == pytest.approx(sum(results["wall_seconds"].values()), abs=0.1) and prov["seed"] == 1
    assert set(results["ppl"]["xpos"]) == {"full", "sliding", "bca", "bca_sinks", "yarn"}  # methods: xpos only
    assert set(results["ppl"]["xpos_random"]) == {"full", "sliding", "bca"}
    # the random-position run trained with L_max = the longest evaluation length; evaluation is ordinary
    state = torch.load(work / "runs" / "xpos_random" / "checkpoints" / "checkpoint_last.pt", weights_only=False)
    assert state["cfg"]["model"]["random_positions"] == 8 * L
    for needle in ("BCA + 4 sinks | ", "full + YaRN | ", "LeX (xPos), random positions | BCA"):
        assert needle in tables, (needle, tables)
    # a method at l: BCA with sinks sees the same context as BCA there; YaRN's factor is 1 at l ("auto")
    assert results["ppl"]["xpos"]["bca_sinks"][str(L)] == pytest.approx(results["ppl"]["xpos"]["bca"][str(L)], rel=1e-5)
    assert results["ppl"]["xpos"]["bca_sinks"][str(8 * L)] != pytest.approx(results["ppl"]["xpos"]["bca"][str(8 * L)], rel=1e-6)
    assert results["ppl"]["xpos"]["yarn"][str(L)] == pytest.approx(results["ppl"]["xpos"]["full"][str(L)], rel=1e-5)
    assert results["ppl"]["xpos"]["yarn"][str(8 * L)] != pytest.approx(results["ppl"]["xpos"]["full"][str(8 * L)], rel=1e-3)
    assert (work / "methods_vs_length.png").stat().st_size > 10_000
    assert (work / "random_positions_vs_length.png").stat().st_size > 10_000
    assert set(results["ppl"]["xpos_scalar_zeta"]["bca"]) == {str(L), str(8 * L)}  # ablations: l and 8l only
    assert 0 < results["resolution"]["xpos"]["bca"][str(2 * L)] < 1
    assert (work / "ppl_vs_length.png").stat().st_size > 10_000
    # at l every window sees the same context: one number
    assert results["ppl"]["xpos"]["full"][str(L)] == pytest.approx(results["ppl"]["xpos"]["bca"][str(L)], rel=1e-5)

    again = run_cli(args, timeout=300)
    assert again.stdout.count("done already") == 3 * 4 + 2 and "[14/14]" in again.stdout, again.stdout
    assert "fairseq-train" not in again.stdout

    with pytest.raises(AssertionError, match="other options"):
        run_cli([*args[:-3], "--resolution-texts", "3"])
    with pytest.raises(AssertionError, match="unknown runs"):
        run_cli([*args[:6], "--runs", "xpos,rotary"])


def test_ruler_table_reads_lex_ruler_reports():
    from lex_plugin.experiments.reproduce.probe_tables import markdown_ruler

    def cell(task, window, length, depth, score, trials=2):
        return {"task": task, "window": window, "length": length, "depth": depth, "distractors": 9, "trials": trials,
                "score": score, "items": trials, "found": int(score), "tokens": length, "attention": {}, "accuracy": score / trials}

    report = {"results": [cell("vt", "full", L, 0.1, 2.0), cell("vt", "full", L, 0.9, 1.0), cell("vt", "full", 2 * L, 0.1, 0.0),
                          cell("vt", "full", 2 * L, 0.9, 0.0), cell("fwe", "full", L, None, 1.0)]}
    text = markdown_ruler({"rope": report}, ["xpos", "rope"], L)
    assert text.startswith("RoPE (Roformer):") and "| vt | full | 0.75 | 0.00 |" in text and "| fwe | full | 0.50 | - |" in text
    greedy = text[text.index("greedy exact match"):text.index("RULER-lite ranking")]  # the first table
    assert "| vt | full | - | - |" in greedy and "| fwe | full | - | - |" in greedy  # no greedy counts: "-", not 0
    summary = text[text.index("effective length"):]
    assert "| full | ranking | 0.750 | 0.000 |" in summary  # fwe has no 2l row: the averages are vt's alone (3 decimals)
    assert "left out, not scored at every length: fwe" in summary


def test_flat_and_retrieving_verdicts(tmp_path):
    """The verdict table reads perplexity ratios and passkey accuracy at 8l by structured mode (log-n rows
    apart; methods with other arguments unprobed), and names the rows that are both flat and retrieving."""
    from lex_plugin.experiments.reproduce.plots import plot_flat_and_retrieving
    from lex_plugin.experiments.reproduce.probe_tables import flat_and_retrieving, markdown_flat_and_retrieving

    l, lengths = 16, [16, 32, 256]
    ppl = {"rope": {"full": {16: 10.0, 256: 15.0}, "bca": {16: 10.0, 256: 9.9}, "rerope": {16: 10.0, 256: 10.04},
                    "rerope_logn": {16: 10.0, 256: 10.0}, "ntk": {16: 10.0, 256: 12.0}, "yarn_logn": {16: 10.0, 256: 10.2},
                    "yarn": {16: 10.0, 256: 11.0}, "bca_sinks": {16: 10.0, 256: 9.8}}}

    def cell(mode, logn, hits, scaling=None):
        return {"window": mode, "length": 8 * l, "retrieved": hits, "trials": 10,
                "attention": {"mode": mode, "logn": logn, "rope_scaling": scaling}}

    passkey = {"rope": {"results": [cell("full", False, 10), cell("bca", False, 1), cell("rerope", False, 9),
                                    cell("rerope", True, 5), cell("full", True, 7, "yarn"), cell("full", False, 3, "yarn"),
                                    {"window": "full", "length": 2 * l, "retrieved": 0, "trials": 10}]}}
    rows = {r["method"]: r for r in flat_and_retrieving(ppl, passkey, ["rope"], l, lengths)}
    assert rows["full"]["ratio"] == 1.5 and rows["full"]["passkey"] == 1.0 and not rows["full"]["flat"]
    assert rows["bca"]["flat"] and rows["bca"]["retrieves"] is False
    assert rows["rerope"]["flat"] and rows["rerope"]["retrieves"] and rows["rerope_logn"]["passkey"] == 0.5
    assert rows["ntk"]["passkey"] is None and rows["ntk"]["retrieves"] is None
    # a RoPE scaling is probed under its own name, log-n apart; sinks are not probed
    assert rows["yarn_logn"]["passkey"] == 0.7 and rows["yarn"]["passkey"] == 0.3 and rows["bca_sinks"]["passkey"] is None
    text = markdown_flat_and_retrieving(list(rows.values()), l, 256)
    assert "**Flat and retrieving:** RoPE (Roformer) + ReRoPE (w = l/2)" in text
    assert "| 1.004 | 0.90 (9/10; 0.60-0.98) | yes | yes |" in text
    assert plot_flat_and_retrieving(list(rows.values()), l, 256, tmp_path / "f.png") and (tmp_path / "f.png").stat().st_size > 5000
    assert "none" in markdown_flat_and_retrieving([dict(rows["full"])], l, 256)
    assert "not decided" in markdown_flat_and_retrieving([dict(rows["ntk"])], l, 256)


def test_wilson_interval_matches_published_values():
    """The 95% Wilson score interval against values computed by hand from Wilson (1927): 42/50, 50/50, 0/10."""
    from lex_plugin.experiments.reproduce.probe_tables import wilson_interval

    assert wilson_interval(42, 50) == pytest.approx((0.7149, 0.9166), abs=1e-4)
    assert wilson_interval(50, 50) == pytest.approx((0.9287, 1.0), abs=1e-4)
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    with pytest.raises(ValueError, match="hits <= trials"):
        wilson_interval(11, 10)


def test_budgets_are_snapshots_of_one_run_under_bf16_autocast(data_bin, tmp_path):
    """--budgets trains one run in stages of one schedule: the snapshot holds its budget's updates, the staged
    run ends where one uninterrupted run of the same schedule ends, and each snapshot gets its own report,
    the table of ratios against training tokens and its plot; a run trained past a budget is refused."""
    from lex_plugin.experiments.recipe import fairseq_train_command

    work, env = tmp_path / "repro", {"LEX_EMULATED_BF16": "1"}
    args = [sys.executable, str(REPO / "scripts" / "reproduce.py"), "--work", str(work), "--data-bin", str(data_bin),
            "--runs", "rope", "--max-update", "4", "--budgets", "2", "--bf16-autocast", "--batch-size", "4",
            "--training-length", str(L), "--lengths", f"{L},{4 * L}", "--eval-tokens", "512", "--resolution-texts", "1",
            "--methods", "", "--in-process"]  # each step in this process; the uninterrupted run below in its own
    proc = run_cli(args, env=env, timeout=600)
    assert "[1/6] train rope to 2" in proc.stdout and "[2/6] eval rope at 2 updates" in proc.stdout, proc.stdout
    ckpts = work / "runs" / "rope" / "checkpoints"
    snap = torch.load(ckpts / "checkpoint_u2.pt", weights_only=False)
    last = torch.load(ckpts / "checkpoint_last.pt", weights_only=False)
    assert snap["optimizer_history"][-1]["num_updates"] == 2 and last["optimizer_history"][-1]["num_updates"] == 4
    for state in (snap, last):  # one schedule of 4 updates, trained under bf16 autocast
        assert state["cfg"]["lr_scheduler"]["total_num_update"] == 4 and state["cfg"]["task"]["bf16_autocast"]
    # the same 4 updates without the stop at 2
    straight = tmp_path / "straight"
    run_cli(fairseq_train_command(data_bin, straight, arch="lex_lm_tiny", model_args=["--pos-emb", "rope"], tokens_per_sample=L,
                                  batch_size=4, lr="1.5e-3", updates=4, warmup=1, break_mode="none",
                                  save_interval_updates=4, log_interval=25, seed=1, extra=["--bf16-autocast"]),
            env=env, timeout=300)
    other = torch.load(straight / "checkpoint_last.pt", weights_only=False)["model"]
    assert other.keys() == last["model"].keys()
    for key, value in last["model"].items():
        torch.testing.assert_close(value, other[key], rtol=0, atol=1e-6, msg=key)
    assert not torch.equal(snap["model"]["decoder.embed_tokens.weight"], last["model"]["decoder.embed_tokens.weight"])

    results = json.loads((work / "results.json").read_text())
    at2, at4 = results["budgets"]["rope"]["2"], results["budgets"]["rope"]["4"]
    assert set(at2) == {"full", "sliding", "bca"} and at4["full"] == results["ppl"]["rope"]["full"]
    assert at2["full"][str(L)] != pytest.approx(at4["full"][str(L)], rel=1e-4)
    tables = (work / "tables.md").read_text()
    ratio = at2["full"][str(4 * L)] / at2["full"][str(L)]
    num = reproduce.tables._num
    assert f"| RoPE (Roformer) | full attention | 2 | {2 * 4 * L} | {num(at2['full'][str(L)])} | {num(ratio)} |" in tables
    assert (work / "ratio_vs_tokens.png").stat().st_size > 10_000

    # killed after fairseq saved at the budget, before the stamp: resuming fairseq there would take one step more
    # before it checks --max-update, so the checkpoint is kept as it is, and the run still ends where it should
    shutil.copy2(ckpts / "checkpoint_u2.pt", ckpts / "checkpoint_last.pt")
    for done in ("train_u2.done", "train.done", "length_report.json"):
        (work / "runs" / "rope" / done).unlink()
    again = run_cli(args, env=env, timeout=600)
    assert "[1/6] train rope to 2: done already" in again.stdout and again.stdout.count("fairseq-train") == 1, again.stdout
    resumed = torch.load(ckpts / "checkpoint_last.pt", weights_only=False)
    assert resumed["optimizer_history"][-1]["num_updates"] == 4
    for key, value in resumed["model"].items():
        torch.testing.assert_close(value, other[key], rtol=0, atol=1e-6, msg=key)

    with pytest.raises(AssertionError, match="has trained 4 updates, past 3"):  # a snapshot is taken on the way, never after
        run_cli([a if a != "2" else "2,3" for a in args], env=env)


def test_in_process_steps_run_fairseq_and_lex_and_report_failures_like_a_process(tmp_path):
    """--in-process: fairseq-train, fairseq-eval-lm and lex commands (not prepare) have an entry point here; a failing
    one returns a non-zero code with its traceback or usage error in the step's output, as its process would; the
    working directory, sys.argv and the root logger are put back."""
    import io
    import logging

    from lex_plugin.experiments.reproduce.in_process import entry_point, run_in_process

    assert entry_point(["fairseq-train", "x"]) and entry_point(["fairseq-eval-lm", "x"])
    assert entry_point([sys.executable, "-m", "lex_plugin.cli", "passkey", "x"])
    assert entry_point([sys.executable, "-m", "lex_plugin.cli", "prepare", "x"]) is None
    assert entry_point(["fairseq-preprocess", "x"]) is None and entry_point(["bash", "x.sh"]) is None
    cwd, argv, handlers = os.getcwd(), sys.argv[:], logging.getLogger().handlers[:]
    out = io.StringIO()
    missing = tmp_path / "no-data-bin"
    assert run_in_process(["fairseq-eval-lm", missing, "--user-dir", REPO / "lex_plugin", "--task", "lex_language_modeling",
                           "--path", tmp_path / "none.pt"], out, tmp_path) == 1
    assert "Traceback" in out.getvalue() and str(missing) in out.getvalue(), out.getvalue()[-2000:]
    out = io.StringIO()
    assert run_in_process([sys.executable, "-m", "lex_plugin.cli", "passkey", "--no-such-option"], out, tmp_path) == 2
    assert "no-such-option" in out.getvalue()
    assert (os.getcwd(), sys.argv, logging.getLogger().handlers) == (cwd, argv, handlers)


def test_a_profile_fills_the_options_not_given(tmp_path, monkeypatch):
    """--profile magnitudes stands for its flags; what the command line gives wins (the options reproduce() is called
    with; reproduce() is replaced by a recorder)."""
    from click.testing import CliRunner

    from conftest import _script

    script = _script("reproduce.py")
    calls = []
    monkeypatch.setattr(script, "reproduce", lambda work, o, runs, *rest, **kw: calls.append(o.as_json()) or "")
    monkeypatch.setenv("LEX_EMULATED_BF16", "1")

    def options(*extra):
        result = CliRunner().invoke(script.main, ["--profile", "magnitudes", "--work", str(tmp_path / "w"),
                                                  "--corpus", str(tmp_path / "no-corpus"), *extra])
        return calls.pop() if result.exit_code == 0 else result.output

    o = options()
    assert (o["training_length"], o["batch_size"], o["max_update"], o["budgets"], o["bf16_autocast"], o["methods"]) == (
        64, 64, 6000, [750, 1500, 3000], True, [])
    assert o["lengths"] == [64 * 2 ** i for i in range(7)]  # l .. 64l
    o = options("--training-length", "128", "--max-update", "20", "--budgets", "5,10", "--no-bf16-autocast")
    assert (o["training_length"], o["max_update"], o["budgets"], o["bf16_autocast"], o["batch_size"]) == (128, 20, [5, 10], False, 64)
    assert o["lengths"] == [128 * 2 ** i for i in range(7)]
    assert "give --budgets with --max-update" in options("--max-update", "1000")


def test_a_ruler_bin_without_answer_lengths_is_written_again(tmp_path, monkeypatch):
    """A ruler-bin written before rows recorded their answer lengths (no train.answers.npy) is removed and its
    step runs again; one with them is kept and its step skipped. The steps are recorded, not run."""
    ruler_bin = tmp_path / "work" / "ruler-bin"
    calls = []
    work, data, o, _ = _recorded_steps(tmp_path, monkeypatch, ["ruler"], lambda key, done: calls.append(
        (key, sorted(p.name for p in ruler_bin.glob("*")) if ruler_bin.exists() else None)))
    ruler_bin.mkdir(parents=True)
    (ruler_bin / "train.idx").write_text("rows without their answer lengths")
    reproduce.reproduce(work, o, ["xpos"], tmp_path, data)
    steps = dict(calls)
    assert steps["ruler data"] is None  # the old bin was gone before the step wrote it again
    assert [k for k, _ in calls].index("ruler data") < [k for k, _ in calls].index("ruler finetune xpos")
    assert (ruler_bin / reproduce.RULER_DATA_DONE).exists() and not (ruler_bin / "train.idx").exists()
    calls.clear()
    (ruler_bin / "train.idx").write_text("rows written with their answer lengths")
    reproduce.reproduce(work, o, ["xpos"], tmp_path, data)
    assert "ruler data" not in dict(calls) and (ruler_bin / "train.idx").exists()


def test_far_context_verdicts():
    """Flat from ppl(16l) / ppl(l), far from LongPPL(16l) over the sliding window of l's at 16l, answers far from
    BABILong-lite's greedy accuracy at 8l (mean over the tasks that fitted) against 0.50 and 0.900 x the window's own at
    l (definitions.BABILONG_RETRIEVES, BABILONG_KEPT); undecided without it."""
    from lex_plugin.experiments.reproduce.probe_tables import far_context, markdown_babilong, markdown_far_context, markdown_longppl

    def row(mode, length, ppl, longppl):
        return {"window": mode, "attention": {"mode": mode}, "length": length, "protocol": "stream", "ppl": ppl,
                "longppl": longppl, "key_tokens": 40}

    longppl = {"rope": {"results": [row("full", L, 10.0, 50.0), row("full", 16 * L, 13.0, 30.0),
                                    row("bca", L, 10.0, 50.0), row("bca", 16 * L, 9.9, 50.5),
                                    row("rerope", L, 10.0, 50.0), row("rerope", 16 * L, 10.04, 40.0),
                                    row("dca", L, 10.0, 50.0), row("dca", 16 * L, 10.04, 45.0),
                                    row("sliding", L, 10.0, 50.0), row("sliding", 16 * L, 10.0, 48.0)],
                        "longppl": {"key_tokens": 40}},
               "alibi": {"results": [row("full", L, 12.0, 60.0), row("full", 16 * L, 12.05, 59.0),
                                     row("sliding", 16 * L, 12.2, 59.5)]},
               "rope_no_window": {"results": [row("full", L, 10.0, 50.0), row("full", 16 * L, 13.0, 30.0)]}}

    def cell(task, mode, length, greedy, trials=10):
        return {"task": task, "window": mode, "attention": {"mode": mode}, "length": length, "trials": trials, "greedy": greedy}

    babilong = {"rope": {"results": [
        cell("qa1", "full", L, 9), cell("qa2", "full", L, 7), cell("qa1", "full", 8 * L, 6), cell("qa2", "full", 8 * L, 4),
        cell("qa1", "rerope", L, 8), cell("qa2", "rerope", L, 8), cell("qa1", "rerope", 8 * L, 8),
        cell("qa2", "rerope", 8 * L, 0, trials=0),  # qa2 did not fit 8l: left out of the mean, not a 0
        cell("qa1", "dca", L, 10), cell("qa1", "dca", 8 * L, 8),  # 0.8 >= 0.5 but below 0.9 x 1.0
        cell("qa1", "bca", L, 8), cell("qa1", "bca", 8 * L, 4)]}}
    rows = {(r["run"], r["method"]): r for r in far_context(longppl, babilong, L)}
    full, bca, rerope, dca = (rows["rope", m] for m in ("full", "bca", "rerope", "dca"))
    assert full["ratio"] == pytest.approx(1.3) and not full["flat"] and full["far"] and full["longppl_ratio"] == pytest.approx(0.625)
    assert full["greedy_l"] == pytest.approx(0.8) and full["greedy_8l"] == pytest.approx(0.5) and full["answers_far"] is False
    assert bca["flat"] and bca["far"] is False and bca["answers_far"] is False
    assert rerope["flat"] and rerope["far"] and rerope["greedy_8l"] == pytest.approx(0.8) and rerope["answers_far"] is True
    assert dca["flat"] and dca["far"] and dca["answers_far"] is False
    assert rows["alibi", "full"]["answers_far"] is None  # no BABILong report: undecided
    text = markdown_far_context(list(rows.values()), L)
    assert text.endswith("**All three:** RoPE (Roformer) + ReRoPE (w = l/2)")
    assert "| **RoPE (Roformer)** | **ReRoPE (w = l/2)** | yes (1.004) | yes (0.83) | yes (0.80 (0.80)) |" in text
    assert "| ALiBi | full attention | yes (1.004) | yes (0.99) | - |" in text  # 59 / 59.5, not 59 / 60
    assert rows["rope", "sliding"]["far"] is False  # the window of l itself reads nothing beyond l (48 / 50 against l)
    assert rows["rope_no_window", "full"]["far"] is None and rows["rope_no_window", "full"]["longppl_ratio"] is None
    assert "| RoPE (Roformer) | ReRoPE (w = l/2) | 0.80 | 0.80 |" in markdown_babilong(babilong, ["rope"], L)
    table = markdown_longppl(longppl, ["rope", "alibi"], L)
    assert table.startswith("RoPE (Roformer): 40 key tokens") and "| BCA | 10.00 | 9.90 | 0.990 | 50.00 | 50.50 | 1.01 |" in table
    assert markdown_far_context([rows["rope", "bca"]], L).endswith("**All three:** none")
    assert "not decided" in markdown_far_context([rows["alibi", "full"]], L)  # no BABILong: no verdict, not "none"


def test_the_battery_runs_its_data_once_and_counts_its_steps(tmp_path, monkeypatch):
    """--methods longppl,babilong: LongPPL on each checkpoint, the BABILong-lite data written once (first run), each
    run fine-tuned and probed; the step count announced equals the steps taken. The steps are recorded, not run."""
    calls = []
    work, data, o, announced = _recorded_steps(tmp_path, monkeypatch, ["longppl", "babilong"],
                                               lambda key, done: calls.append((key, done)))
    reproduce.reproduce(work, o, ["xpos", "alibi"], tmp_path, data)
    keys = [k for k, _ in calls]
    assert keys.count("babilong data") == 1 and announced == [len(calls)]
    assert keys[keys.index("train alibi"):] == ["train alibi", "eval alibi", "resolution alibi full", "resolution alibi bca",
                                                "longppl alibi", "babilong finetune alibi", "babilong alibi"]
    done = dict(calls)
    assert done["longppl xpos"] == work / "runs" / "xpos" / "longppl.json"
    assert done["babilong xpos"] == work / "runs" / "xpos" / "babilong.json"


def test_longppl_common_scores_a_run_on_the_committed_key_tokens(tmp_path, monkeypatch):
    """--methods longppl,longppl_common: the own-key-token probe finds its tokens with the reproduction's rule; the
    common one reads the committed evaluator's report (--key-tokens) with no rule of its own, into longppl_common.json."""
    calls, commands = [], {}
    work, data, o, announced = _recorded_steps(tmp_path, monkeypatch, ["longppl", "longppl_common"],
                                               lambda key, done: calls.append((key, done)))
    _record_commands(monkeypatch, commands)
    reproduce.reproduce(work, o, ["rnope_swa"], tmp_path, data)
    run, done = work / "runs" / "rnope_swa", dict(calls)
    assert announced == [len(calls)] and done["longppl_common rnope_swa"] == run / "longppl_common.json"
    own, common = commands["longppl rnope_swa"], commands["longppl_common rnope_swa"]
    assert "--longppl-alpha" in own and "--key-tokens" not in own
    assert common[common.index("--key-tokens") + 1] == str(reproduce.catalogue.LONGPPL_KEY_TOKENS) and "--longppl-alpha" not in common
    assert reproduce.catalogue.LONGPPL_KEY_TOKENS == REPO / "examples/lex_lm/designs_1000/longppl_evaluator.json"
    # under --probe-windows full, both add the sliding window of l that 'reads the far context' divides by; a run
    # trained with a sink token keeps it visible there, as it was in training
    commands.clear()
    o = dataclasses.replace(o, probe_windows=("full",))
    reproduce.reproduce(tmp_path / "work_full", o, ["rnope_swa", "xpos_sink_token"], tmp_path, data)
    for key in ("longppl rnope_swa", "longppl_common rnope_swa", "longppl_common xpos_sink_token"):
        cmd = commands[key]
        assert cmd[cmd.index("--eval-windows") + 1] == "full,sliding"
        assert ("--sink-tokens" in cmd) == key.endswith("sink_token")
    # a design whose global layer chooses its own keys (MoBA, landmark tokens) takes no bounded window: full alone
    reproduce.reproduce(tmp_path / "work_moba", o, ["xpos_bca_nope_moba", "xpos_bca_nope_landmark"], tmp_path, data)
    for key in ("longppl", "longppl_common"):
        for name in ("xpos_bca_nope_moba", "xpos_bca_nope_landmark"):
            cmd = commands[f"{key} {name}"]
            assert cmd[cmd.index("--eval-windows") + 1] == "full", (key, name)


def test_each_fine_tuning_seed_is_fine_tuned_and_probed_apart(tmp_path, monkeypatch):
    """--finetune-seeds 1,2,3 on a design: the run's seed under the plain names, seeds 2 and 3 each fine-tuned with its
    own --seed into passkey_ft_seedN/ and probed at l..8l and 16l into their own reports; the count announced equals
    the steps taken; a seed given twice is refused."""
    import dataclasses

    calls, commands = [], {}
    work, data, o, announced = _recorded_steps(tmp_path, monkeypatch, ["passkey_finetuned"],
                                               lambda key, done: calls.append((key, done)))
    _record_commands(monkeypatch, commands)
    o = dataclasses.replace(o, finetune_seeds=(1, 2, 3))
    reproduce.reproduce(work, o, ["rnope_swa"], tmp_path, data)
    done = dict(calls)
    assert announced == [len(calls)]
    run = work / "runs" / "rnope_swa"
    for seed in (2, 3):
        cmd = commands[f"finetune rnope_swa seed {seed}"]
        assert cmd[cmd.index("--seed") + 1] == str(seed) and cmd[cmd.index("--save-dir") + 1] == str(run / f"passkey_ft_seed{seed}")
        assert done[f"passkey_finetuned rnope_swa_seed{seed}"] == run / f"passkey_finetuned_seed{seed}.json"
        assert done[f"passkey_finetuned rnope_swa 16l_seed{seed}"] == run / f"passkey_finetuned_16l_seed{seed}.json"
        probe = commands[f"passkey_finetuned rnope_swa_seed{seed}"]
        assert probe[probe.index("--path") + 1] == str(run / f"passkey_ft_seed{seed}" / "checkpoint_last.pt")
    assert commands["finetune rnope_swa"][commands["finetune rnope_swa"].index("--seed") + 1] == "1"
    # RULER-lite likewise: each seed fine-tuned on the probe's data into its own directory, probed into its own report
    calls.clear()
    (tmp_path / "ruler").mkdir()
    work, data, o, announced = _recorded_steps(tmp_path / "ruler", monkeypatch, ["ruler"],
                                               lambda key, done: calls.append((key, done)))
    _record_commands(monkeypatch, commands)
    reproduce.reproduce(work, dataclasses.replace(o, finetune_seeds=(1, 2, 3)), ["rnope_swa"], tmp_path, data)
    done, run = dict(calls), work / "runs" / "rnope_swa"
    assert announced == [len(calls)] and done["ruler rnope_swa"] == run / "ruler_answers.json"
    for seed in (2, 3):
        cmd = commands[f"ruler finetune rnope_swa_seed{seed}"]
        assert cmd[cmd.index("--seed") + 1] == str(seed) and cmd[cmd.index("--save-dir") + 1] == str(run / f"ruler_ft_answers_seed{seed}")
        assert done[f"ruler rnope_swa_seed{seed}"] == run / f"ruler_answers_seed{seed}.json"
        probe = commands[f"ruler rnope_swa_seed{seed}"]
        assert probe[probe.index("--path") + 1] == str(run / f"ruler_ft_answers_seed{seed}" / "checkpoint_last.pt")
    with pytest.raises(ValueError, match="a seed given twice"):
        dataclasses.replace(o, finetune_seeds=(2, 2))


def _record_commands(monkeypatch, commands):
    """Make the (recording) runner of :func:`_recorded_steps` also keep each step's command: ``commands[key]``."""
    record = reproduce.steps.Runner.__call__

    def recording(self, key, cmd, log, done, stamp=False, then=None):
        commands[key] = [str(c) for c in cmd]
        record(self, key, cmd, log, done, stamp, then)

    monkeypatch.setattr(reproduce.steps.Runner, "__call__", recording)


def _recorded_steps(tmp_path, monkeypatch, methods, record):
    """reproduce() with its steps recorded, not run: ``record(key, done)`` is called for each step and its ``done``
    file touched. Returns (work, data-bin, options with ``methods``, the step counts the runner was told)."""
    work, data = tmp_path / "work", tmp_path / "data-bin"
    announced = []

    class RecordingRunner:
        def __init__(self, work, steps, in_process=False):
            announced.append(steps)

        def __call__(self, key, cmd, log, done, stamp=False, then=None):
            record(key, done)
            done.parent.mkdir(parents=True, exist_ok=True)
            done.touch()

    monkeypatch.setattr(reproduce.steps, "Runner", RecordingRunner)
    monkeypatch.setattr(reproduce.steps, "write_results", lambda *a: "")
    data.mkdir()
    (data / "dict.txt").write_text("")
    o = reproduce.ReproduceOptions(arch="lex_lm_tiny", training_length=L, max_update=3, batch_size=4, lr="1e-3", seed=1, lengths=[L, 2 * L],
             eval_tokens=512, resolution_texts=2, methods=list(methods))
    return work, data, o, announced


def test_design_runs_train_their_design_and_drope_switches_for_the_last_12_percent(tmp_path, monkeypatch):
    """The trained designs are runs of the reproduction: each trains with its options (DroPE with --drope-start at
    88% of --max-update), is evaluated like the main runs, and gets its own table beside RoPE and NoPE."""
    commands, announced = {}, []
    work, data, o, _ = _recorded_steps(tmp_path, monkeypatch, [], lambda key, done: None)

    class Recording:
        def __init__(self, work, steps, in_process=False):
            announced.append(steps)

        def __call__(self, key, cmd, log, done, stamp=False, then=None):
            commands[key] = [str(c) for c in cmd]
            _write_grid_report(done, cmd, {})

    monkeypatch.setattr(reproduce.steps, "Runner", Recording)
    o = reproduce.ReproduceOptions(**{**o.as_json(), "max_update": 300, "methods": []})
    reproduce.reproduce(work, o, ["rope_drope", "none_tt", "rope_qknorm", "rope_ssmax", "rnope_swa", "gemma_5to1",
                                  "xpos_bca_nope_landmark"], tmp_path, data)
    drope = commands["train rope_drope"]
    assert drope[drope.index("--drope-start") + 1] == "264" and "--qk-norm" in drope
    assert drope[drope.index("--max-update") + 1] == "300"
    tuned = commands["train none_tt"]
    assert tuned[tuned.index("--temperature-tuning-beta") + 1] == "0.1" and tuned[tuned.index("--pos-emb") + 1] == "none"
    assert "--ssmax" in commands["train rope_ssmax"] and "--qk-norm" in commands["train rope_qknorm"]
    swa, gemma = commands["train rnope_swa"], commands["train gemma_5to1"]  # the local window is l / 4 = 16
    assert swa[swa.index("--layer-pattern") + 1] == f"rope/sliding:{L // 4}*3,none/full"
    assert gemma[gemma.index("--layer-pattern") + 1] == f"rope/sliding:{L // 4}*5,rope/full"
    assert gemma[gemma.index("--decoder-layers") + 1] == "6"
    evaluated = commands["eval none_tt"]
    assert evaluated[evaluated.index("--eval-windows") + 1] == "full,sliding,bca"
    # landmark tokens choose their keys in the global layer: full attention only, no resolution analysis
    landmark = commands["train xpos_bca_nope_landmark"]
    assert landmark[landmark.index("--landmark-block-size") + 1] == str(L // 8)
    evaluated = commands["eval xpos_bca_nope_landmark"]
    assert evaluated[evaluated.index("--eval-windows") + 1] == "full"
    assert "resolution xpos_bca_nope_landmark full" not in commands and "resolution none_tt full" in commands
    # a pattern whose global layers are NoPE has no positions to remap: its probes leave the position maps out
    o = reproduce.ReproduceOptions(**{**o.as_json(), "methods": ["passkey_finetuned"]})
    (work / "passkey-bin").mkdir(exist_ok=True)
    (work / "passkey-bin" / "train.idx").touch()
    commands.clear()
    reproduce.reproduce(work, o, ["rnope_swa", "gemma_5to1"], tmp_path, data)
    swa_windows = commands["passkey_finetuned rnope_swa"][commands["passkey_finetuned rnope_swa"].index("--windows") + 1]
    gemma_windows = commands["passkey_finetuned gemma_5to1"][commands["passkey_finetuned gemma_5to1"].index("--windows") + 1]
    assert swa_windows == "full,bca,sliding,lm_infinite" and "rerope" in gemma_windows.split(","), (swa_windows, gemma_windows)
    # a design's fine-tuned passkey is also probed at 16l under full attention (the verdict's greedy column)
    at_16l = commands["passkey_finetuned rnope_swa 16l"]
    assert at_16l[at_16l.index("--lengths") + 1] == str(16 * L) and at_16l[at_16l.index("--windows") + 1] == "full"
    assert at_16l[at_16l.index("--json") + 1].endswith("rnope_swa/passkey_finetuned_16l.json")
    # a run that is no design (a reference method) is probed at 16l under the windows --probe-windows names, and not at
    # 16l where it names none; the steps announced count it
    for windows, expected in ((["full", "rerope"], "full,rerope"), ([], None)):
        other = tmp_path / f"work_{len(windows)}"
        (other / "passkey-bin").mkdir(parents=True)
        (other / "passkey-bin" / "train.idx").touch()
        commands.clear()
        reproduce.reproduce(other, reproduce.ReproduceOptions(**{**o.as_json(), "probe_windows": windows}), ["rope"],
                            tmp_path, data)
        at_16l = commands.get("passkey_finetuned rope 16l")
        assert (at_16l and at_16l[at_16l.index("--windows") + 1]) == expected, at_16l
        assert announced[-1] == len(commands)  # the steps announced are the steps taken


def _write_grid_report(done, cmd, valid_ppl):
    """Touch a recorded step's ``done`` file; a recalibration grid step's (``valid_C{C}.json``) gets a length report
    with its one row, ppl ``valid_ppl[C]`` (default 100)."""
    done.parent.mkdir(parents=True, exist_ok=True)
    done.touch()
    if done.name.startswith("valid_C"):
        cmd = [str(c) for c in cmd]
        c, length = float(cmd[cmd.index("--attention-temperature") + 1]), int(cmd[cmd.index("--eval-lengths") + 1])
        done.write_text(json.dumps({"results": [{"window": "full", "length": length, "attention": {"mode": "full"},
                                                 "protocol": "stream", "ppl": valid_ppl.get(c, 100.0)}]}))


def _record_grid_steps(monkeypatch, work, commands, announced, valid_ppl):
    """reproduce()'s steps recorded, not run: each step's command into ``commands`` (by key), the step count the
    runner was told into ``announced``, a recalibration grid step's report written (:func:`_write_grid_report`); the
    passkey and RULER-lite data-bins marked written."""
    class Recording:
        def __init__(self, work, steps, in_process=False):
            announced.append(steps)

        def __call__(self, key, cmd, log, done, stamp=False, then=None):
            commands[key] = [str(c) for c in cmd]
            _write_grid_report(done, cmd, valid_ppl)

    monkeypatch.setattr(reproduce.steps, "Runner", Recording)
    for bin_dir, done in (("passkey-bin", "train.idx"), ("ruler-bin", reproduce.RULER_DATA_DONE)):
        (work / bin_dir).mkdir(parents=True, exist_ok=True)
        (work / bin_dir / done).touch()


def test_a_drope_run_is_recalibrated_under_each_fine_tuning_seed(tmp_path, monkeypatch):
    """With --finetune-seeds, the recalibration probes each seed's fine-tuned checkpoint under the chosen C, into the
    plain run's file names with ``_seedN`` (what the verdict reads as a range); the steps announced are the steps
    taken."""
    commands, announced = {}, []
    valid = {0.0: 60.0}
    work, data, o, _ = _recorded_steps(tmp_path, monkeypatch, ["passkey_finetuned", "ruler"], lambda k, d: None)
    o = dataclasses.replace(o, finetune_seeds=(1, 2, 3))
    _record_grid_steps(monkeypatch, work, commands, announced, valid)
    reproduce.reproduce(work, o, ["rope_drope"], tmp_path, data)
    rdir, arg = work / "runs" / "rope_drope" / "recalibrated", lambda cmd, flag: cmd[cmd.index(flag) + 1]
    assert announced == [len(commands)]
    for suffix in ("", "_seed2", "_seed3"):
        for key, ckpt_dir, out in ((f"passkey_finetuned rope_drope C=0{suffix}", "passkey_ft", "passkey_finetuned"),
                                   (f"passkey_finetuned rope_drope C=0 16l{suffix}", "passkey_ft", "passkey_finetuned_16l"),
                                   (f"ruler rope_drope C=0{suffix}", "ruler_ft_answers", "ruler_answers")):
            cmd = commands[key]
            assert arg(cmd, "--path") == str(work / "runs" / "rope_drope" / f"{ckpt_dir}{suffix}" / "checkpoint_last.pt"), key
            assert float(arg(cmd, "--attention-temperature")) == 0.0, key
            assert arg(cmd, "--json") == str(rdir / f"{out}{suffix}.json"), key


def test_a_drope_run_is_recalibrated_under_the_c_its_valid_grid_chose(tmp_path, monkeypatch):
    """DroPE's recalibration (beta = 1 + C ln(L / l)): every C of the grid evaluated on the valid split at the longest
    length under full attention; the C with the lowest ppl there (0.1 here) then gives the test length evaluation and
    the probes the verdict reads, on the checkpoints they were fine-tuned into, into runs/rope_drope/recalibrated;
    a run that is not DroPE gets none; the steps announced are the steps taken."""
    commands, announced = {}, []
    valid = {0.0: 80.0, 0.05: 70.0, 0.1: 60.0, 0.2: 65.0, 0.4: 90.0, 0.8: 150.0}
    work, data, o, _ = _recorded_steps(tmp_path, monkeypatch, ["passkey_finetuned", "ruler", "longppl", "longppl_common"],
                                       lambda k, d: None)
    _record_grid_steps(monkeypatch, work, commands, announced, valid)
    reproduce.reproduce(work, o, ["rope_drope", "rope_ssmax"], tmp_path, data)
    rdir = work / "runs" / "rope_drope" / "recalibrated"
    assert announced == [len(commands)]
    grid = [k for k in commands if k.startswith("recalibrate rope_drope")]
    assert grid == [f"recalibrate rope_drope C={c:g}" for c in reproduce.DROPE_TEMPERATURES]
    arg = lambda cmd, flag: cmd[cmd.index(flag) + 1]  # noqa: E731
    for c, key in zip(reproduce.DROPE_TEMPERATURES, grid):
        cmd = commands[key]
        assert (arg(cmd, "--gen-subset"), arg(cmd, "--eval-lengths"), arg(cmd, "--eval-windows")) == ("valid", str(2 * L), "full")
        assert float(arg(cmd, "--attention-temperature")) == c
    assert json.loads((rdir / "choice.json").read_text())["C"] == 0.1
    assert reproduce.recalibration_choice(rdir, 2 * L) == (0.1, valid)
    evaluation = commands["eval rope_drope C=0.1"]
    assert (arg(evaluation, "--gen-subset"), arg(evaluation, "--eval-lengths"), arg(evaluation, "--eval-windows"),
            arg(evaluation, "--attention-temperature"), arg(evaluation, "--report-json")) == (
        "test", f"{L},{2 * L}", "full", "0.1", str(rdir / "length_report.json"))
    tuned = {"passkey_finetuned rope_drope C=0.1": ("passkey_ft", "passkey_finetuned.json"),
             "passkey_finetuned rope_drope C=0.1 16l": ("passkey_ft", "passkey_finetuned_16l.json"),
             "ruler rope_drope C=0.1": ("ruler_ft_answers", "ruler_answers.json")}
    for key, (ckpt_dir, out) in tuned.items():
        cmd = commands[key]
        assert arg(cmd, "--path") == str(work / "runs" / "rope_drope" / ckpt_dir / "checkpoint_last.pt"), key
        assert (arg(cmd, "--windows"), arg(cmd, "--attention-temperature"), arg(cmd, "--json")) == (
            "full", "0.1", str(rdir / out)), key
    assert arg(commands["passkey_finetuned rope_drope C=0.1 16l"], "--lengths") == str(16 * L)
    # LongPPL on its own and on the common evaluator's key tokens, under full attention and the window of l that
    # 'reads the far context' divides by
    for key, written in (("longppl", "longppl.json"), ("longppl_common", "longppl_common.json")):
        longppl = commands[f"{key} rope_drope C=0.1"]
        assert (arg(longppl, "--path"), arg(longppl, "--eval-windows"), arg(longppl, "--attention-temperature"),
                arg(longppl, "--report-json")) == (
            str(work / "runs" / "rope_drope" / "checkpoints" / "checkpoint_last.pt"), "full,sliding", "0.1", str(rdir / written))
        assert ("--key-tokens" in longppl) == (key == "longppl_common")
    assert not any("C=" in k for k in commands if "rope_ssmax" in k)
    # the tables read the chosen C and its test perplexities (a work directory of those two reports alone)
    tables = tmp_path / "tables" / "runs" / "rope_drope" / "recalibrated"
    tables.mkdir(parents=True)
    shutil.copy(rdir / "choice.json", tables / "choice.json")
    rows = report({("full+beta(C=0.1)", L): 50.0, ("full+beta(C=0.1)", 2 * L): 49.0})
    for row in rows["results"]:  # the structured mode stays "full" under a temperature
        row["attention"] = {"mode": "full", "logit_scale": 1.0 if row["length"] == L else 1.07}
    (tables / "length_report.json").write_text(json.dumps(rows))
    collected = reproduce.results._collect(tmp_path / "tables", o, ["rope_drope", "rope_ssmax"]).recalibrated
    assert list(collected) == ["rope_drope"] and collected["rope_drope"]["choice"]["C"] == 0.1
    assert collected["rope_drope"]["ppl"] == {L: 50.0, 2 * L: 49.0}
    # a grid report made again that now chooses another C: refused, since the reports after it hold the old C
    valid[0.2] = 10.0
    with pytest.raises(reproduce.ReproduceError, match="records C = 0.1, but the grid's reports now choose C = 0.2"):
        reproduce.reproduce(work, o, ["rope_drope"], tmp_path, data)
    valid[0.2] = 65.0
    reproduce.reproduce(work, o, ["rope_drope"], tmp_path, data)  # the grid made again as it was: C = 0.1 again
    # a tie goes to the first C of the grid (the smaller change); a missing report: no choice yet
    (rdir / "valid_C0.2.json").write_text((rdir / "valid_C0.1.json").read_text())
    assert reproduce.recalibration_choice(rdir, 2 * L)[0] == 0.1
    (rdir / "valid_C0.8.json").unlink()
    assert reproduce.recalibration_choice(rdir, 2 * L) is None


def test_the_recalibration_table_bolds_the_chosen_c_and_compares_the_ratios():
    from lex_plugin.experiments.reproduce.tables import markdown_recalibration

    recalibrated = {"rope_drope": {"choice": {"C": 0.1, "length": 4 * L, "ppl": {"0": 80.0, "0.1": 60.0, "0.4": 90.0}},
                                   "ppl": {L: 50.0, 4 * L: 45.0}}}
    text = markdown_recalibration(recalibrated, {"rope_drope": {"full": {L: 50.0, 4 * L: 60.0}}}, [L, 4 * L], L)
    assert f"| DroPE (RoPE + QK-norm, NoPE for the last 12%) | {4 * L} (4l) | 80.00 | **60.00** | 90.00 | 0.1 |" in text
    assert "| plain | 50.00 | 60.00 | 1.20 |" in text and "| beta, C = 0.1 | 50.00 | 45.00 | 0.90 |" in text


def _sink_token_steps(tmp_path, monkeypatch, probe_windows=()):
    """The commands of a reproduction of xpos_sink_token and rope_ssmax (every probe, the probes' modes limited to
    ``probe_windows``), recorded, not run: ({step: argv}, the step counts announced)."""
    commands = {}
    work, data, o, _ = _recorded_steps(tmp_path, monkeypatch, ["passkey", "passkey_finetuned", "ruler", "longppl", "babilong"],
                                       lambda key, done: None)
    o = dataclasses.replace(o, probe_windows=tuple(probe_windows))
    announced = []

    class Recording:
        def __init__(self, work, steps, in_process=False):
            announced.append(steps)

        def __call__(self, key, cmd, log, done, stamp=False, then=None):
            commands[key] = [str(c) for c in cmd]
            done.parent.mkdir(parents=True, exist_ok=True)
            done.touch()

    monkeypatch.setattr(reproduce.steps, "Runner", Recording)
    for bin_dir, done in (("passkey-bin", "train.idx"), ("ruler-bin", reproduce.RULER_DATA_DONE),
                          ("babilong-bin", "train.answers.npy")):
        (work / bin_dir).mkdir(parents=True, exist_ok=True)
        (work / bin_dir / done).touch()
    reproduce.reproduce(work, o, ["xpos_sink_token", "rope_ssmax"], tmp_path, data)
    return commands, announced


PROBE_STEPS = ["passkey", "passkey_finetuned", "ruler", "longppl", "babilong"]


def test_a_sink_token_run_keeps_its_sink_under_every_bounded_window(tmp_path, monkeypatch):
    """A run trained with --sink-token is evaluated and probed with --sink-tokens 1 (its sink stays visible under BCA
    and the sliding window, as in training); a run without one gets no sink flag; and its resolution steps are
    skipped (the analysis refuses a sink token)."""
    commands, announced = _sink_token_steps(tmp_path, monkeypatch)
    for step in ["eval", *PROBE_STEPS]:
        sink = commands[f"{step} xpos_sink_token"]
        assert sink[sink.index("--sink-tokens") + 1] == "1", step
        assert "--sink-tokens" not in commands[f"{step} rope_ssmax"], step
    assert not any(k.startswith("resolution xpos_sink_token") for k in commands)
    assert "resolution rope_ssmax full" in commands
    # the 16l probe is full attention alone, which takes no sink flag; the steps announced are the steps taken
    assert "--sink-tokens" not in commands["passkey_finetuned xpos_sink_token 16l"]
    assert announced == [len(commands)]


def test_a_sink_token_run_probed_under_full_attention_alone_gets_no_sink_flag(tmp_path, monkeypatch):
    """--probe-windows full (the 1,000-update recipe): the probes take no --sink-tokens, which the lex commands
    refuse where no mode takes sinks (the reproduction stopped at the sink token's passkey probe); the length
    evaluation, over BCA and the sliding window too, keeps it, and so does LongPPL, measured under the window of l
    as well (the far-context goal's denominator)."""
    commands, _ = _sink_token_steps(tmp_path, monkeypatch, probe_windows=["full"])
    for step in PROBE_STEPS:
        cmd = commands[f"{step} xpos_sink_token"]
        flag = "--windows" if "--windows" in cmd else "--eval-windows"  # (LongPPL: fairseq-eval-lm)
        windowed = step == "longppl"
        assert cmd[cmd.index(flag) + 1] == ("full,sliding" if windowed else "full"), step
        assert ("--sink-tokens" in cmd) == windowed, step
    evaluation = commands["eval xpos_sink_token"]
    assert evaluation[evaluation.index("--sink-tokens") + 1] == "1"


def test_probe_windows_narrow_every_probe_and_refuse_what_no_run_takes(tmp_path, monkeypatch):
    """--probe-windows full,leaky_rerope: every probe command of a rotary run compares exactly those two, ALiBi's only
    full attention (Leaky ReRoPE does not apply to it); a design whose global layers are NoPE takes no position map,
    so --probe-windows dca is refused before any step runs, naming the run; an unknown window is refused."""
    _, _, o, _ = _recorded_steps(tmp_path, monkeypatch, ["passkey_finetuned", "ruler", "longppl", "babilong"],
                                 lambda key, done: None)
    o = dataclasses.replace(o, probe_windows=("full", "leaky_rerope"))
    for rotary, expected in ((True, "full,leaky_rerope"), (False, "full")):
        cmds = {"passkey": reproduce.passkey_command(tmp_path, tmp_path / "c.pt", tmp_path / "p.json", o, rotary),
                "ruler": reproduce.ruler_command(tmp_path, tmp_path / "c.pt", tmp_path / "r.json", o, rotary),
                "babilong": reproduce.babilong_command(tmp_path, tmp_path / "c.pt", tmp_path / "b.json", o, rotary)}
        for name, cmd in cmds.items():
            assert cmd[cmd.index("--windows") + 1] == expected, name
        longppl = reproduce.longppl_command(tmp_path, tmp_path / "c.pt", tmp_path / "l.json", o, rotary)
        assert longppl[longppl.index("--eval-windows") + 1] == expected + ",sliding"  # FAR_CONTEXT's denominator
    # the default probe windows hold the sliding window already: listed once
    every = dataclasses.replace(o, probe_windows=())
    windows = reproduce.longppl_command(tmp_path, tmp_path / "c.pt", tmp_path / "l.json", every, True)
    assert windows[windows.index("--eval-windows") + 1] == ",".join(reproduce.probe_windows(True, True))
    steps = []
    (tmp_path / "b").mkdir()
    work, data, o, _ = _recorded_steps(tmp_path / "b", monkeypatch, ["ruler"], lambda key, done: steps.append(key))
    (data / "dict.txt").unlink()  # a fresh data-bin: nothing may be prepared either
    with pytest.raises(reproduce.ReproduceError, match="xpos_bca_nope, ruler: --probe-windows dca: none applies"):
        reproduce.reproduce(work, dataclasses.replace(o, probe_windows=("dca",)), ["xpos", "xpos_bca_nope"], tmp_path, data)
    assert steps == [] and not work.exists()  # refused before anything was written: a corrected re-run is not blocked
    with pytest.raises(reproduce.ReproduceError, match="passkey_finetuned_logn: .* none applies to this run with log-n"):
        reproduce.reproduce(work, dataclasses.replace(o, methods=("passkey_finetuned_logn",), probe_windows=("bca", "sliding")),
                            ["alibi"], tmp_path, data)
    assert steps == [] and not work.exists()
    with pytest.raises(ValueError, match="not a probe window"):
        reproduce.probe_windows(True, True, ("chunked",))


def test_the_script_refuses_options_that_would_change_nothing(tmp_path, monkeypatch):
    """A method named in --methods that runs on none of --runs, --longest beside --lengths, and --probe-windows or
    --passkey-trials with no probe that reads them are refused, naming the option; the default methods (all, each
    where it applies) and options that apply go through (reproduce() is replaced by a recorder)."""
    from click.testing import CliRunner

    from conftest import _script

    script = _script("reproduce.py")
    calls = []
    monkeypatch.setattr(script, "reproduce", lambda work, o, runs, *rest, **kw: calls.append((runs, o.methods)) or "")
    base = ["--work", str(tmp_path / "w"), "--corpus", str(tmp_path)]
    refused = [(["--runs", "sinusoidal", "--methods", "yarn"], "yarn runs on none of --runs sinusoidal"),
               (["--runs", "alibi", "--methods", "rerope,yarn"], "yarn runs on none of --runs alibi"),
               (["--runs", "rope", "--lengths", "256,512", "--longest", "2"], "--longest"),
               (["--runs", "rope", "--methods", "rerope", "--probe-windows", "full"], "--probe-windows"),
               (["--runs", "rope", "--methods", "ruler", "--passkey-trials", "5"], "--passkey-trials"),
               (["--runs", "rope", "--methods", "passkey,longppl", "--finetune-seeds", "2,3"], "--finetune-seeds")]
    for args, message in refused:
        result = CliRunner().invoke(script.main, base + args)
        assert result.exit_code == 2 and message in result.output, (args, result.output)
    assert calls == []
    for args in (["--runs", "sinusoidal"], ["--runs", "alibi,rope", "--methods", "rerope,yarn"],
                 ["--runs", "rope", "--methods", "passkey,ruler", "--probe-windows", "full", "--passkey-trials", "5"],
                 ["--runs", "rope", "--methods", "ruler", "--finetune-seeds", "2,3"]):  # RULER-lite takes seeds too
        result = CliRunner().invoke(script.main, base + args)
        assert result.exit_code == 0, (args, result.output)
    assert [runs for runs, _ in calls] == [["sinusoidal"], ["alibi", "rope"], ["rope"], ["rope"]]


def test_a_flat_and_retrieving_row_needs_both_counts_or_neither():
    from lex_plugin.experiments.reproduce.probe_tables import flat_and_retrieving_row

    row = flat_and_retrieving_row("rope", "rerope", 1.004, 9, 10)
    assert (row["passkey"], row["flat"], row["retrieves"]) == (0.9, True, True) and row["interval"][0] < 0.9 < row["interval"][1]
    unprobed = flat_and_retrieving_row("rope", "full", 1.05)
    assert (unprobed["passkey"], unprobed["retrieves"], unprobed["interval"], unprobed["flat"]) == (None, None, None, False)
    for retrieved, trials in ((3, None), (None, 10), (0, 0)):
        with pytest.raises(ValueError, match="give retrieved and trials"):
            flat_and_retrieving_row("rope", "full", 1.0, retrieved, trials)


def test_the_probe_tables_judge_a_ratio_as_they_write_it():
    """A ratio of 1.0049 rounds to 1.00 (flat), but the tables write it at 3 decimals, "1.005", which reads 1.01: the
    row says "no" beside "1.005" in both tables, where it said "yes". A LongPPL ratio of 0.995 is written 1.00 and
    does not read the far context (< 1.00); a ranked score of 179 / 200 = 0.895 is written 0.90 and retrieves."""
    from lex_plugin.experiments.definitions import FLAT
    from lex_plugin.experiments.reproduce.probe_tables import (answers_far, far_context, flat_and_retrieving_row,
                                                                markdown_babilong, markdown_far_context,
                                                                markdown_flat_and_retrieving)

    assert FLAT.meets(1.0049) and not flat_and_retrieving_row("rope", "full", 1.0049)["flat"]
    assert flat_and_retrieving_row("rope", "full", 1.00449)["flat"]
    row = flat_and_retrieving_row("rope", "full", 1.0049, 179, 200)  # 0.895
    assert "{:.2f}".format(0.895) == "0.90" and row["retrieves"]
    assert "| 1.005 | 0.90 (179/200; " in markdown_flat_and_retrieving([row], L, 16 * L)
    assert "| no | yes |" in markdown_flat_and_retrieving([row], L, 16 * L)
    report = {"results": [{"length": L, "ppl": 10.0, "window": "full", "attention": {"mode": "full"}, "longppl": 4.0},
                          {"length": 16 * L, "ppl": 10.049, "window": "full", "attention": {"mode": "full"}, "longppl": 3.98},
                          {"length": 16 * L, "ppl": 11.0, "window": "sliding", "attention": {"mode": "sliding"},
                           "longppl": 4.0}]}
    (full,) = [r for r in far_context({"rope": report}, {}, L) if r["method"] == "full"]
    assert not full["flat"] and not full["far"]  # 1.0049 written 1.005; LongPPL 0.995 written 1.00, not < 1.00
    assert "| no (1.005) | no (1.00) |" in markdown_far_context([full], L)
    # BABILong-lite's third test reads the accuracies as written: 0.4951 is written 0.50 and answers far; 0.50 at 8l
    # keeps 0.55's at l (0.91) but not 0.56's (0.89)
    assert answers_far(0.0, 0.4951) and not answers_far(0.0, 0.4949)
    assert answers_far(0.55, 0.50) and not answers_far(0.56, 0.50)
    assert not answers_far(0.67, 0.60) and answers_far(0.60, 0.54)  # 0.896 is below 0.900; 0.900 is not
    babilong = {"rope": {"results": [{"task": "qa1", "window": "full", "attention": {"mode": "full"}, "length": n * L,
                                      "trials": 200, "greedy": 99} for n in (1, 8)]}}  # 0.495, written 0.50 in both
    assert "| 0.50 | 0.50 |" in markdown_babilong(babilong, ["rope"], L)
    only_8l = dict(full, greedy_l=None, greedy_8l=0.5, answers_far=None)  # a report with 8l but not l: undecided
    assert "| 0.50 (-) |" in markdown_far_context([only_8l], L)  # a cell written, not a TypeError
    longppl = {"rope": {"results": [dict(report["results"][0], longppl=0.0),  # LongPPL of 0 at l: no ratio, "-"
                                    dict(report["results"][1], ppl=float("inf"), longppl=4.0)]}}
    from lex_plugin.experiments.reproduce.probe_tables import markdown_longppl
    assert "| 10.00 | inf | inf | 0.00 | 4.00 | - |" in markdown_longppl(longppl, ["rope"], L)


def test_the_options_check_themselves():
    """ReproduceOptions refuses what no step could run, naming the flag, whoever builds it (the script or a caller)."""
    good = dict(training_length=L, max_update=10, lengths=LENGTHS, eval_tokens=8 * L)
    assert reproduce.ReproduceOptions(**good).lengths == tuple(LENGTHS)
    for change, message in [({"training_length": 31}, "--training-length 31"), ({"training_length": 0}, "--training-length 0"),
                            ({"lengths": [2 * L, 4 * L]}, "must include the training length"),
                            ({"lengths": [L // 2, L]}, "nothing shorter"), ({"eval_tokens": 8 * L - 1}, "--eval-tokens"),
                            ({"budgets": [10]}, "give --budgets with --max-update"), ({"budgets": [0]}, "must lie in 1..9"),
                            ({"max_update": 0}, "--max-update 0"), ({"passkey_trials": 0}, "--passkey-trials 0"),
                            ({"methods": ["rerope", "rerop"]}, "--methods: unknown rerop"),
                            ({"probe_windows": ["full", "chunked"]}, "--probe-windows: unknown chunked")]:
        with pytest.raises(ValueError, match=message):
            reproduce.ReproduceOptions(**{**good, **change})
