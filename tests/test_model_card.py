"""The model card of an export (``lex export-hf --length-report ... --probe-report ...``): the figures of the committed
reports of one verdict row, worked out here from their raw rows, in the card's tables, its definitions table and the
Hub's machine-readable ``model-index`` (read back with huggingface_hub, as the Hub reads it), each with its provenance;
and the reports the card refuses."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO

huggingface_hub = pytest.importorskip("huggingface_hub")
from lex_plugin.export.model_card import CardReport, model_card  # noqa: E402

RUN = REPO / "examples/lex_lm/designs_1000/runs/xpos_bca_nope"  # a verdict row: its base's and fine-tuned reports
L = 256
CONFIG = SimpleNamespace(training_length=L, position_options={"gamma": 0.4, "scale_base": 512}, pos_emb="xpos",
                         num_hidden_layers=4, hidden_size=256, num_attention_heads=4, vocab_size=8000,
                         max_position_embeddings=16 * L)
# the base model, the checkpoint its length report's command names (the probes measured fine-tuned copies of it)
CHECKPOINT = Path("/work/main/work/designs2/runs/xpos_bca_nope/checkpoints/checkpoint_last.pt")


def _read(name: str, probe: bool = True) -> CardReport:
    return CardReport.read(RUN / name, probe=probe)


def _card(reports, name="xpos_bca_nope") -> str:
    return model_card(CONFIG, "full", CHECKPOINT, reports, name=name)


def _raw(name: str) -> dict:
    return json.loads((RUN / name).read_text())


def _passkey(name: str, length: int) -> tuple:
    """(ranked, greedy) over the depths of the full-attention rows at ``length``, summed from the raw rows."""
    rows = [r for r in _raw(name)["results"] if r["attention"]["mode"] == "full" and r["length"] == length]
    trials = sum(r["trials"] for r in rows)
    return sum(r["retrieved"] for r in rows) / trials, sum(r["greedy"] for r in rows) / trials


def _ruler(name: str, length: int) -> float:
    """RULER-lite's mean at ``length`` under full attention from the raw rows: each task scored at every length (a
    task skipped at one is left out), its accuracy averaged over depths, then over tasks."""
    rows = [r for r in _raw(name)["results"] if r["attention"]["mode"] == "full"]
    lengths = {r["length"] for r in rows}
    tasks = [t for t in dict.fromkeys(r["task"] for r in rows)
             if all(any(r["task"] == t and r["length"] == n and not r.get("skipped") for r in rows) for n in lengths)]
    means = []
    for t in tasks:
        scored = [r["accuracy"] for r in rows if r["task"] == t and r["length"] == length and not r.get("skipped")]
        means.append(sum(scored) / len(scored))
    return sum(means) / len(means)


@pytest.fixture(scope="module")
def card():
    reports = [_read("length_report.json", probe=False), _read("longppl_common.json"), _read("passkey_finetuned.json"),
               _read("passkey_finetuned_16l.json"), _read("ruler_answers.json")]
    return _card(reports)


def test_the_model_index_carries_every_figure_of_the_reports_as_the_hub_reads_it(card):
    """Read back with huggingface_hub (as the Hub parses a card): one perplexity per stream row of the length report,
    LongPPL per row of the common evaluator's report, ranked and greedy passkey and RULER-lite's mean per length, each
    the value worked out here from the raw rows (4 decimals), filed by probe (the dataset's configuration)."""
    data = huggingface_hub.ModelCard(card).data
    results = {(r.dataset_config, r.metric_name): r for r in data.eval_results}
    assert data.model_name == "xpos_bca_nope" and {r.dataset_config for r in data.eval_results} == {
        "stream", "passkey", "ruler-lite"}
    stream = [r for r in _raw("length_report.json")["results"] if r.get("protocol", "stream") == "stream"]
    ppl = [r for r in data.eval_results if r.metric_type == "perplexity"]
    assert len(ppl) == len(stream) == 15
    for row in stream:
        n = row["length"]
        metric = results["stream", f"test perplexity at {n} tokens ({n / L:g}l), {row['window']}"]
        assert metric.metric_value == round(row["ppl"], 4) and metric.dataset_split == "test"
    longppl = [r for r in data.eval_results if r.metric_type == "longppl"]
    assert len(longppl) == 6 and all("RoPE trained at 4096 tokens" in r.metric_name for r in longppl)
    for n, (report, length) in {8 * L: ("passkey_finetuned.json", 8 * L), 16 * L: ("passkey_finetuned_16l.json", 16 * L)}.items():
        ranked, greedy = _passkey(report, length)
        at = f"at {n} tokens ({n // L}l), full"
        assert results["passkey", f"passkey ranked first among 10 (50 prompts) {at}"].metric_value == round(ranked, 4)
        assert results["passkey", f"greedy passkey written whole (50 prompts) {at}"].metric_value == round(greedy, 4)
    ruler = results["ruler-lite", f"RULER-lite mean of the tasks scored at every length from l (ranking) at {8 * L} "
                                  f"tokens (8l), full"]
    assert ruler.metric_value == round(_ruler("ruler_answers.json", 8 * L), 4)
    assert all(r.verified is False and r.task_type == "text-generation" for r in data.eval_results)


def test_the_card_judges_the_figures_against_the_definitions_and_says_where_each_comes_from(card):
    """The definitions table: flat from the length report, reads the far context from the common evaluator's LongPPL,
    retrieves (greedy at 16l) and ranks first (8l) from the passkey reports, RULER-lite at 8l, each the figure worked
    out here, judged at its bar; the length report's command names the exported (base) checkpoint, the probes' reports
    their fine-tuned copies, and the table says so. Each report's section ends with its provenance line."""
    table = card.split("## Against the project's definitions")[1]
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.strip("|").split("|")]
            for line in table.splitlines() if line.startswith("| ") and "---" not in line and "definition" not in line}
    length = {(r["window"], r["length"]): r["ppl"] for r in _raw("length_report.json")["results"]}
    assert rows["flat"][2:] == [f"{length['full', 16 * L] / length['full', L]:.4f}", "yes", "`length_report.json`"]
    common = {(r["window"], r["length"]): r["longppl"] for r in _raw("longppl_common.json")["results"]}
    assert rows["reads the far context"][2:4] == [f"{common['full', 16 * L] / common['sliding(256)', 16 * L]:.4f}", "yes"]
    greedy_16l = _passkey("passkey_finetuned_16l.json", 16 * L)[1]
    assert rows["retrieves"][2:] == [f"{greedy_16l:.4f}", "yes" if round(greedy_16l, 2) >= 0.90 else "no",
                                     "`passkey_finetuned_16l.json` (another checkpoint)"]
    assert rows["ranks the passkey first"][2] == f"{_passkey('passkey_finetuned.json', 8 * L)[0]:.4f}"
    ruler = _ruler("ruler_answers.json", 8 * L)
    assert rows["RULER-lite"][2:4] == [f"{ruler:.4f}", "yes" if round(ruler, 2) >= 0.47 else "no"]
    # provenance: the common evaluator's report records its commit and wall time; the old probes' say what is unknown
    prov = _raw("longppl_common.json")["provenance"]
    section = card.split("### LongPPL by length (`longppl_common.json`)")[1].split("###")[0]
    assert f"commit {prov['commit'][:10]}" in section and f"{prov['wall_s']} s" in section
    passkey = card.split("### Passkey retrieval (`passkey_finetuned.json`)")[1].split("###")[0]
    assert "commit unrecorded" in passkey and "names the checkpoint `" in passkey and "passkey_ft" in passkey
    assert f"| full | {length['full', L]:.2f} |" in card
    assert "The report names the exported checkpoint." in card.split("## Far-context probes")[0]


def test_a_card_without_probe_reports_says_how_to_add_them():
    card = _card([_read("length_report.json", probe=False)])
    assert "--probe-report" in card.split("## Far-context probes")[1]
    assert [r.dataset_config for r in huggingface_hub.ModelCard(card).data.eval_results] == ["stream"] * 15
    bare = _card([])
    assert "model-index" not in bare and "No report given reads a definition's figure." in bare


def test_the_card_refuses_reports_it_cannot_read_as_given(tmp_path):
    """A probe's report as the length report, a length report without LongPPL as a probe's, a report of no known kind,
    one that is not JSON, two reports giving one figure, a report of another training length: each refused, saying
    what to give instead."""
    with pytest.raises(ValueError, match="give it as --probe-report"):
        _read("passkey_finetuned.json", probe=False)
    with pytest.raises(ValueError, match="give it as --length-report"):
        _read("length_report.json")
    odd = tmp_path / "odd.json"
    odd.write_text(json.dumps({"results": [{"tokens": 3}]}))
    with pytest.raises(ValueError, match="none of a length report's"):
        CardReport.read(odd, probe=True)
    odd.write_text("{not json")
    with pytest.raises(ValueError, match="is not JSON"):
        CardReport.read(odd, probe=True)
    with pytest.raises(FileNotFoundError, match="no report"):
        CardReport.read(tmp_path / "missing.json", probe=True)
    with pytest.raises(ValueError, match="both give passkey ranked first among 10 under full at 256 tokens"):
        _card([_read("passkey_finetuned.json"), _read("passkey_finetuned_seed2.json")])
    other = tmp_path / "passkey_l512.json"
    other.write_text(json.dumps(dict(_raw("passkey_finetuned.json"), training_length=512)))
    with pytest.raises(ValueError, match="measured at training length 512; the model's is 256"):
        _card([CardReport.read(other, probe=True)])
    fixed = tmp_path / "fixed_only.json"
    fixed.write_text(json.dumps(dict(_raw("length_report.json"), results=[
        dict(r, protocol="fixed_target") for r in _raw("length_report.json")["results"]])))
    with pytest.raises(ValueError, match="no stream rows"):
        CardReport.read(fixed, probe=False)
    with pytest.raises(ValueError, match="one --length-report"):
        _card([_read("length_report.json", probe=False), _read("length_report.json", probe=False)])


def test_a_babilong_report_gives_its_greedy_accuracy_by_length():
    """BABILong-lite: the greedy accuracy at each length, the mean over the tasks that fitted (a cell without trials
    left out), worked out here from the committed report's raw rows."""
    path = REPO / "examples/lex_lm/babilong_xpos.json"
    raw = json.loads(path.read_text())
    report = CardReport.read(path, probe=True)
    config = SimpleNamespace(**dict(vars(CONFIG), training_length=raw["training_length"]))
    results = huggingface_hub.ModelCard(model_card(config, "full", CHECKPOINT, [report])).data.eval_results
    assert {r.dataset_config for r in results} == {"babilong-lite"}
    l = raw["training_length"]
    for n in sorted({r["length"] for r in raw["results"]}):
        cells = [r["greedy"] / r["trials"] for r in raw["results"]
                 if r["length"] == n and r["attention"]["mode"] == "full" and r["trials"]]
        [metric] = [r for r in results if r.metric_name.endswith(f"at {n} tokens ({n / l:g}l), full")]
        assert metric.metric_value == round(sum(cells) / len(cells), 4)


def test_only_the_common_evaluators_longppl_is_judged_and_the_checkpoint_is_read_from_either_path_form(tmp_path):
    """LongPPL on the checkpoint's own key tokens is shown but judged by nothing ("reads the far context" reads the
    common evaluator's alone); an eval-lm report names its checkpoint by its command's --path, written `--path X` or
    `--path=X`."""
    own = _card([_read("longppl.json")])
    assert "LongPPL on the key tokens of the evaluated checkpoint" in own
    assert "| reads the far context |" not in own and "| reads the far context |" in _card([_read("longppl_common.json")])
    report = _raw("length_report.json")
    command = report["provenance"]["command"].replace("--path ", "--path=")
    assert "--path=" in command
    path = tmp_path / "length_report.json"
    path.write_text(json.dumps(dict(report, provenance=dict(report["provenance"], command=command))))
    assert "The report names the exported checkpoint." in _card([CardReport.read(path, probe=False)])
    moved = model_card(CONFIG, "full", Path("/elsewhere/checkpoint_last.pt"), [CardReport.read(path, probe=False)])
    assert f"The report names the checkpoint `{CHECKPOINT}`" in moved
