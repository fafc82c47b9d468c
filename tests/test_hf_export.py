"""lex export-hf: the exported Hugging Face model, tokenizer and lm-eval task against the fairseq model and lex prepare."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fairseq.data import Dictionary, data_utils

from lex_plugin.hub_interface import from_pretrained
from lex_plugin.modules.attention.spec import AttentionOptions
from lex_plugin.modules.positions import POSITION_SCHEMES

from conftest import REPO, TRAIN_LEN, build_lex_model, run_cli, shared_data

transformers = pytest.importorskip("transformers")
from lex_plugin.hf import LexCache, LexTokenizer, read_fairseq_dictionary  # noqa: E402
from lex_plugin.export.hf import export_hf  # noqa: E402

L = TRAIN_LEN
SPECS = {"full": AttentionOptions(), "bca": AttentionOptions("bca"), "sliding": AttentionOptions("sliding", "l")}


@pytest.fixture(scope="module")
def hf_env(tmp_path_factory):
    """Environment of a process that loads exports: transformers' module cache in a temporary directory, offline."""
    home = tmp_path_factory.mktemp("hf_home")
    return {"HF_HOME": str(home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@pytest.fixture(scope="module")
def scheme_checkpoints(trained, data_bin, tmp_path_factory):
    """One checkpoint per --pos-emb: the trained xPos model's layers and embeddings, with the scheme's own
    parameters (KERPLE, T5, the learned table) freshly initialised; the trained cfg with pos_emb replaced."""
    ckpt, _ = trained
    base = torch.load(ckpt, map_location="cpu", weights_only=False)
    dictionary = Dictionary.load(str(data_bin / "dict.txt"))
    out = tmp_path_factory.mktemp("schemes")
    paths = {}
    for i, name in enumerate(POSITION_SCHEMES):
        state = dict(base)
        state["cfg"] = dict(base["cfg"])
        model_cfg = dict(state["cfg"]["model"])
        model_cfg["pos_emb"] = name
        for option in [k for k in model_cfg if k.startswith(("xpos_", "rope_"))]:
            model_cfg[option] = None  # xPos's resolved options would be foreign to another scheme
        state["cfg"]["model"] = model_cfg
        fresh = build_lex_model("lex_lm_tiny", dictionary, seed=i, pos_emb=name, tokens_per_sample=L,
                                share_decoder_input_output_embed=True)
        weights = fresh.state_dict()
        weights.update({k: v for k, v in base["model"].items() if k in weights and not k.startswith("decoder.positions.")})
        state["model"] = weights
        path = out / name / "checkpoint_last.pt"
        path.parent.mkdir()
        torch.save(state, path)
        paths[name] = path
    return paths


@pytest.fixture(scope="module")
def exports(scheme_checkpoints, data_bin, tmp_path_factory):
    """name -> (exported directory, LexForCausalLM, fairseq hub, checkpoint), full attention as the default."""
    out = tmp_path_factory.mktemp("exports")
    result = {}
    for name, ckpt in scheme_checkpoints.items():
        model = export_hf(ckpt, data_bin, out / name)
        result[name] = (out / name, model, from_pretrained(ckpt.parent, ckpt.name, data_bin), ckpt)
    return result


@pytest.fixture(scope="module")
def test_tokens(data_bin):
    """(1, 4l) consecutive ids of the real test split."""
    d = Dictionary.load(str(data_bin / "dict.txt"))
    ds = data_utils.load_indexed_dataset(str(data_bin / "test"), d)
    stream = torch.cat([ds[i].long() for i in range(len(ds))])
    return stream[: 4 * L].unsqueeze(0)


@pytest.mark.parametrize("name", list(POSITION_SCHEMES))
def test_logits_equal_fairseq_for_every_scheme_and_window(exports, test_tokens, name):
    _, model, hub, _ = exports[name]
    fairseq_model = hub.models[0]
    checked = 0
    for window, options in SPECS.items():
        try:
            spec = hub.spec_for(options)
            fairseq_model.decoder.check_spec(spec)
        except ValueError:
            continue  # a window this scheme refuses (none of these three today): refused alike by both
        for length in (L, 4 * L):
            if name == "learned" and length > L:
                continue  # the learned table ends at l
            tokens = test_tokens[:, :length]
            with torch.no_grad():
                expected, _ = fairseq_model(tokens, spec=spec)
                got = model(tokens, spec=spec, use_cache=False).logits
            assert got.shape == expected.shape
            torch.testing.assert_close(got, expected, rtol=0, atol=1e-5, msg=f"{name} {window} at {length}")
            checked += 1
    assert checked >= 3


def test_config_maps_the_standard_names(exports):
    directory, model, hub, _ = exports["xpos"]
    config = json.loads((directory / "config.json").read_text())
    assert config["model_type"] == "lex_lm" and config["auto_map"]["AutoModelForCausalLM"] == "modeling_lex.LexForCausalLM"
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"], config["intermediate_size"]) == (4, 256, 4, 1024)
    assert config["vocab_size"] == len(hub.tgt_dict) and config["training_length"] == L
    assert config["position_options"]["xpos_scale_base"] == 512 and config["position_options"]["xpos_gamma"] == 0.4
    assert config["tie_word_embeddings"] is True and config["eos_token_id"] == hub.tgt_dict.eos()
    assert (directory / "model.safetensors").is_file() and (directory / "dict.txt").is_file()


# A process that holds only transformers' world: lex_plugin, fairseq and torchscale cannot be imported (nor is the
# repository on its path); it loads each export from a temporary copy, runs the job and saves what it computed.
ISOLATED_SCRIPT = r"""
import importlib.abc, json, os, sys
REFUSED = ("lex_plugin", "fairseq", "fairseq_cli", "torchscale")
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in REFUSED:
            raise ModuleNotFoundError(f"No module named {name!r} (refused by the test)", name=name)
sys.meta_path.insert(0, Refuse())
repo = os.path.realpath(sys.argv[2])
sys.path = [p for p in sys.path if p and os.path.realpath(p) != repo]
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM, AutoTokenizer, pipeline
job = json.load(open(sys.argv[1]))
tokens = torch.load(job["tokens"])
out = {"logits": {}, "refused": {}}
for name, directory in job["exports"].items():
    for window, attention in job["windows"].items():
        try:
            model = AutoModelForCausalLM.from_pretrained(directory, trust_remote_code=True, attention=attention)
        except ValueError as err:
            out["refused"][f"{name}/{window}"] = str(err)
            continue
        for n in job["lengths"]:
            if n <= job["max_length"].get(name, n):
                with torch.no_grad():
                    out["logits"][f"{name}/{window}/{n}"] = model(tokens[:, :n], use_cache=False).logits
gen = job["generate"]
model = AutoModelForCausalLM.from_pretrained(gen["dir"], trust_remote_code=True)
tok = AutoTokenizer.from_pretrained(gen["dir"], trust_remote_code=True)
out["prompt_ids"] = tok(gen["prompt"]).input_ids
pipe = pipeline("text-generation", model=model, tokenizer=tok)
done = pipe(gen["prompt"], max_new_tokens=gen["steps"], min_new_tokens=gen["steps"], do_sample=False, return_tensors=True)
out["pipeline_ids"] = done[0]["generated_token_ids"]
ids = torch.tensor([out["prompt_ids"]])
with torch.no_grad():
    run = model.generate(ids, max_new_tokens=gen["steps"], min_new_tokens=gen["steps"], do_sample=False,
                         output_logits=True, return_dict_in_generate=True, eos_token_id=None, pad_token_id=1)
    full = model(run.sequences, use_cache=False).logits[0, ids.size(1) - 1:-1]
out["cached_vs_uncached"] = max((s[0] - f).abs().max().item() for s, f in zip(run.logits, full))
base = AutoModel.from_pretrained(gen["dir"], trust_remote_code=True)
with torch.no_grad():
    hidden = base(ids).last_hidden_state
    out["base_vs_head"] = (model.decoder.output_projection(hidden) - model(ids, use_cache=False).logits).abs().max().item()
out["classes"] = [type(model).__name__, type(base).__name__, type(tok).__name__, type(model.config).__name__]
saved = job["saved"]
model.save_pretrained(saved)
tok.save_pretrained(saved)
again = AutoModelForCausalLM.from_pretrained(saved, trust_remote_code=True)
tok_again = AutoTokenizer.from_pretrained(saved, trust_remote_code=True)
with torch.no_grad():
    out["reload_logits"] = (again(ids, use_cache=False).logits - model(ids, use_cache=False).logits).abs().max().item()
out["reload_ids"] = tok_again(gen["prompt"]).input_ids == out["prompt_ids"]
out["saved_modes"] = sorted({os.stat(os.path.join(saved, f)).st_mode & 0o777 for f in os.listdir(saved)})
out["imported"] = sorted(m for m in sys.modules if m.split(".")[0] in REFUSED)
torch.save(out, job["out"])
"""

WINDOWS = {"full": {}, "bca": {"mode": "bca"}, "sliding": {"mode": "sliding", "sliding_window": "l"},
           "rerope": {"mode": "rerope"}, "bca_retrieval": {"mode": "bca", "retrieval_blocks": 1}}


def test_export_runs_with_transformers_alone(exports, test_tokens, data_bin, tmp_path, hf_env):
    """Every --pos-emb's export, copied to a temporary directory, loaded where lex_plugin, fairseq and torchscale
    cannot be imported: the logits equal the fairseq model's (1e-5) under full attention, BCA, the sliding window
    , ReRoPE and BCA with a retrieved block at l and 4l (a window the scheme refuses is refused by both); the tokenizer gives lex generate's
    prompt ids; pipeline("text-generation") writes lex generate's greedy tokens under BCA; scores through the cache
    equal a forward without it (1e-4); AutoModel's hidden states give the head's logits; save_pretrained and
    from_pretrained give the same logits (1e-6) and ids."""
    import shutil

    copies = tmp_path / "copies"
    dirs = {}
    for name, (directory, _, _, _) in exports.items():
        dirs[name] = str(shutil.copytree(directory, copies / name))
    gen_dir = copies / "xpos_bca"
    shutil.copytree(exports["xpos"][0], gen_dir)
    config = json.loads((gen_dir / "config.json").read_text())
    (gen_dir / "config.json").write_text(json.dumps(dict(config, attention={"mode": "bca"})))
    prompt = (shared_data() / "pg" / "test" / "pg730_oliver-twist.txt").read_text(encoding="utf-8")[30_000:30_700]
    prompt = " ".join(prompt.split())  # one paragraph, as lex generate reads a prompt
    torch.save(test_tokens, tmp_path / "tokens.pt")
    job = {"tokens": str(tmp_path / "tokens.pt"), "exports": dirs, "windows": WINDOWS, "lengths": [L, 4 * L],
           "max_length": {"learned": L}, "saved": str(tmp_path / "saved"), "out": str(tmp_path / "out.pt"),
           "generate": {"dir": str(gen_dir), "prompt": prompt, "steps": 2 * L}}
    (tmp_path / "job.json").write_text(json.dumps(job))
    run_cli([sys.executable, "-c", ISOLATED_SCRIPT, str(tmp_path / "job.json"), str(REPO)], env=hf_env)
    got = torch.load(tmp_path / "out.pt")
    assert got["imported"] == []
    assert got["classes"] == ["LexForCausalLM", "LexModel", "LexTokenizer", "LexConfig"]
    checked = 0
    for name, (_, _, hub, _) in exports.items():
        for window, attention in WINDOWS.items():
            spec = hub.spec_for(AttentionOptions(**attention))
            try:
                hub.models[0].decoder.check_spec(spec)
            except ValueError:
                assert f"{name}/{window}" in got["refused"], (name, window)  # refused alike
                continue
            assert f"{name}/{window}" not in got["refused"], got["refused"].get(f"{name}/{window}")
            for n in (L, 4 * L):
                if name == "learned" and n > L:
                    continue
                with torch.no_grad():
                    expected, _ = hub.models[0](test_tokens[:, :n], spec=spec)
                torch.testing.assert_close(got["logits"][f"{name}/{window}/{n}"], expected, rtol=0, atol=1e-5,
                                           msg=f"{name} {window} at {n}")
                checked += 1
    assert checked >= 70 and "rope/rerope" not in got["refused"] and "none/rerope" in got["refused"]
    assert "xpos/bca_retrieval" not in got["refused"] and "alibi/bca_retrieval" in got["refused"]

    hub = from_pretrained(exports["xpos"][3].parent, "checkpoint_last.pt", data_bin, window="bca")
    expected_prompt = [hub.src_dict.eos()] + hub.encode(prompt)[:-1].tolist()
    assert got["prompt_ids"] == expected_prompt  # no closing </s>: the sentence goes on
    expected = hub.continue_tokens(prompt, max_len=2 * L, temperature=0).tolist()
    assert got["pipeline_ids"][len(expected_prompt):] == expected
    assert got["cached_vs_uncached"] <= 1e-4
    assert got["base_vs_head"] <= 1e-5
    assert got["reload_logits"] <= 1e-6 and got["reload_ids"]
    assert got["saved_modes"] == [0o666 & ~_umask()]  # the weights too (safetensors writes 0600)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_exported_files_are_the_package_sources(exports):
    """The remote code an export carries is what the package's sources produce now, and each file is its source
    line for line, but for the header, the rewritten package imports and an entry point's generated closure."""
    from lex_plugin.export.remote_code import exported_modules, remote_code, source_path

    directory = exports["xpos"][0]
    files = remote_code()
    assert sorted(p.name for p in directory.glob("*.py")) == sorted(files) == sorted(exported_modules())
    for name, text in files.items():
        assert (directory / name).read_text(encoding="utf-8") == text, name
    for name, module in exported_modules().items():
        source = source_path(module).read_text(encoding="utf-8").splitlines()
        body = files[name].split("\n# Generated: transformers copies")[0].splitlines()[2:]  # no header, no closure
        assert len(body) == len(source), name
        changed = [(ours, theirs) for ours, theirs in zip(body, source) if ours != theirs]
        assert all(t.lstrip().startswith("from .") and o.lstrip().startswith(("from .lex_", "from .configuration_lex"))
                   for o, t in changed), (name, changed)
    assert {"modeling_lex.py", "lex_modules_attention_executor.py", "lex_data_text.py"} <= set(files)


def test_an_import_an_export_cannot_carry_is_refused(tmp_path, monkeypatch):
    """A package module of the inference path that imports fairseq (or tqdm...) is refused at export, naming the
    file; so is a package import by module name."""
    from lex_plugin.export import remote_code as rc

    root = tmp_path / "lex_plugin"
    (root / "hf").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "hf" / "__init__.py").write_text("")
    for entry in ("configuration", "tokenization"):
        (root / "hf" / f"{entry}.py").write_text("import json\n")
    (root / "hf" / "modeling.py").write_text("from ..helpers import x\n")
    (root / "helpers.py").write_text("import tqdm\nx = 1\n")
    monkeypatch.setattr(rc, "PACKAGE_ROOT", root)
    with pytest.raises(rc.RemoteCodeError, match=r"helpers.py imports 'tqdm'"):
        rc.remote_code()
    (root / "helpers.py").write_text("x = 1\n")
    files = rc.remote_code()
    assert "from .lex_helpers import x" in files["modeling_lex.py"] and files["lex_helpers.py"].endswith("x = 1\n")
    (root / "hf" / "modeling.py").write_text("from .. import helpers\n")
    with pytest.raises(rc.RemoteCodeError, match="imports a module by name"):
        rc.remote_code()


class BoundCheck(transformers.LogitsProcessor):
    """Records the cache's held positions at every generation step."""

    def __init__(self, cache: LexCache):
        self.cache, self.held = cache, []

    def __call__(self, input_ids, scores):
        self.held.append(self.cache.held_positions())
        return scores


@pytest.mark.parametrize("name, options, bound", [
    ("xpos", AttentionOptions("bca"), L),
    ("alibi", AttentionOptions("sliding", "l"), L),
])
def test_greedy_generate_equals_lex_generate_with_a_bounded_cache(scheme_checkpoints, data_bin, tmp_path, name, options, bound):
    model = export_hf(scheme_checkpoints[name], data_bin, tmp_path / "hf", options)
    tok = LexTokenizer(str(tmp_path / "hf" / "dict.txt"), str(tmp_path / "hf" / "spm.model"))
    hub = from_pretrained(scheme_checkpoints[name].parent, "checkpoint_last.pt", data_bin).under(model.spec)
    prompt = (shared_data() / "pg" / "test" / "pg730_oliver-twist.txt").read_text(encoding="utf-8")[30_000:31_500]
    steps = 3 * L
    expected = hub.continue_tokens(prompt, max_len=steps, temperature=0)
    ids = torch.tensor([tok.encode_prompt(prompt)])
    assert ids.size(1) > 2 * L  # the prompt alone outgrows the window
    cache = LexCache()
    check = BoundCheck(cache)
    out = model.generate(ids, max_new_tokens=steps, min_new_tokens=steps, do_sample=False, past_key_values=cache,
                         logits_processor=transformers.LogitsProcessorList([check]), eos_token_id=None, pad_token_id=1)
    got = out[0, ids.size(1):]
    assert torch.equal(got, expected), (got[:20].tolist(), expected[:20].tolist())
    assert len(check.held) == steps and max(check.held) <= bound, (max(check.held), bound)
    assert cache.get_seq_length() == ids.size(1) + steps - 1


def test_tokenizer_ids_equal_lex_prepare_like(data_bin, tmp_path):
    """Two held-out books (cut to 40k characters) through lex prepare --like and through the tokenizer."""
    src = tmp_path / "books"
    (src / "test").mkdir(parents=True)
    books = sorted((shared_data() / "pg" / "test").glob("*.txt"))[1:3]
    texts = []
    for path in books:
        text = path.read_text(encoding="utf-8")[:40_000]
        (src / "test" / path.name).write_text(text, encoding="utf-8")
        texts.append(text)
    dest = tmp_path / "like"
    run_cli([sys.executable, "-m", "lex_plugin.cli", "prepare", str(src), str(dest), "--like", str(data_bin),
             "--splits", "test", "--workers", "1"])
    d = Dictionary.load(str(dest / "dict.txt"))
    ds = data_utils.load_indexed_dataset(str(dest / "test"), d)
    binarised = torch.cat([ds[i].long() for i in range(len(ds))]).tolist()
    tok = LexTokenizer(str(data_bin / "dict.txt"), str(data_bin / "spm.model"))
    first, second = (tok(t + "\n", add_special_tokens=False).input_ids for t in texts)  # a file's text: closed
    eos = d.eos()
    assert binarised == first + [eos] + second  # lex prepare separates documents by an empty line (a lone </s>)
    assert tok(texts[0] + "\n").input_ids == [eos] + first
    assert tok(texts[0]).input_ids == [eos] + first[:-1]  # no line break at the end: the last paragraph stays open
    # decode round-trips wherever no piece was unknown (an <unk> decodes to " \u2047 ", SentencePiece's mark)
    known, paragraph = [], []
    for i in first:
        paragraph.append(i)
        if i == eos:
            known += paragraph if d.unk() not in paragraph else []
            paragraph = []
    assert len(known) > 0.8 * len(first)
    assert tok(tok.decode(known), add_special_tokens=False).input_ids == known  # each </s> a paragraph end
    assert tok.decode(known).count("\n\n") == known.count(eos) and tok.decode(known).endswith("\n\n")
    assert tok.decode([eos]) == "\n\n"  # lm-eval's stop string for generate_until: an empty one stops every answer


def test_lm_eval_rolling_loglikelihood_equals_lex_score(exports, data_bin, tmp_path, hf_env):
    """lm_eval --model hf on the local WikiText-2 task (first 3 articles) against lex score on the same articles."""
    directory, _, _, ckpt = exports["xpos"]
    out = tmp_path / "lm_eval"
    env = dict(hf_env)
    proc = run_cli([Path(sys.executable).parent / "lm_eval", "--model", "hf", "--model_args",
                    f"pretrained={directory},trust_remote_code=True,max_length=16384,dtype=float32",
                    "--include_path", str(REPO / "examples" / "lex_lm" / "lm_eval"), "--tasks", "lex_wikitext2",
                    "--limit", "3", "--batch_size", "1", "--device", "cpu", "--output_path", str(out)], env=env)
    results = json.loads(next(out.rglob("results_*.json")).read_text())["results"]["lex_wikitext2"]
    total = results["loglikelihood,none"]

    from lex_plugin.data.text import split_wikitext

    pages = split_wikitext((shared_data() / "wikitext-2" / "test.txt").read_text(encoding="utf-8"))[:3]
    for i, page in enumerate(pages):
        (tmp_path / f"page{i}.txt").write_text(page, encoding="utf-8")
    report = tmp_path / "score.json"
    run_cli([sys.executable, "-m", "lex_plugin.cli", "score", str(data_bin), *[str(tmp_path / f"page{i}.txt") for i in range(3)],
             "--path", str(ckpt), "--json", str(report)])
    docs = json.loads(report.read_text())["documents"]
    expected = -sum(doc["loss"] * doc["tokens"] * math.log(2) for doc in docs)
    assert abs(total - expected) <= 1e-4 * abs(expected), (total, expected, proc.stdout[-500:])


def test_lm_eval_ruler_scores_what_the_fairseq_model_writes(exports, tmp_path, hf_env):
    """scripts/lm_eval_ruler.py: lm-eval's offline RULER tasks but cwe on the export, one prompt per task at 1,024 tokens.
    Each prompt fits its length under the export's tokenizer. What lm-eval records as the model's answer is what the
    fairseq model writes greedily after the same ids, and each score is RULER's string_match_all of that answer."""
    pytest.importorskip("lm_eval")
    pytest.importorskip("wonderwords")
    directory, _, hub, _ = exports["xpos"]
    out = tmp_path / "ruler"
    # ruler_cwe is left out: its list of 10 words x 30 copies does not fit 1,024 tokens of this 976-symbol vocabulary,
    # and lm-eval then writes an empty answer list and fails (ZeroDivisionError) instead of saying so
    tasks = ["niah_single_1", "niah_multikey_2", "niah_multikey_3", "ruler_vt", "ruler_fwe"]
    proc = run_cli([sys.executable, str(REPO / "scripts" / "lm_eval_ruler.py"), str(directory), "--lengths", "1024",
                    "--samples", "1", "--tasks", ",".join(tasks), "--out", str(out)], env=dict(hf_env), timeout=900)
    summary = json.loads((out / "ruler_lm_eval.json").read_text())
    assert set(summary["lm_eval"]) == set(tasks), proc.stdout[-2000:]
    tok = transformers.AutoTokenizer.from_pretrained(directory, trust_remote_code=True)
    eos = hub.task.source_dictionary.eos()
    pad = hub.task.source_dictionary.pad()
    from lex_plugin.generation import continue_ids

    for path in out.rglob("samples_*.jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        task = path.name[len("samples_"):].rsplit("_", 1)[0]  # samples_TASK_TIMESTAMP.jsonl
        assert len(rows) == 1 and all(r["doc"]["max_length"] == 1024 for r in rows), (task, len(rows))
        scores = []
        for r in rows:
            prompt, gen = r["arguments"]["gen_args_0"]["arg_0"], r["arguments"]["gen_args_0"]["arg_1"]
            ids = tok(prompt).input_ids  # lm-eval 0.4.13 keeps the tokenizer's default: </s> first, the stream start
            assert len(ids) <= 1024, (task, len(ids))
            with torch.no_grad():
                written = continue_ids(hub.models[0], torch.tensor(ids), gen["max_gen_toks"], eos, pad, temperature=0.0,
                                       stop_at_eos=True)
            text = tok.decode(written.tolist(), skip_special_tokens=True)
            assert r["resps"][0][0].strip() == text.strip(), (task, r["resps"][0][0][:200], text[:200])
            truth = r["doc"]["outputs"]
            scores.append(sum(t.lower() in text.strip().lower() for t in truth) / len(truth))
        assert summary["lm_eval"][task]["1024"] == pytest.approx(sum(scores) / len(scores)), task
    with pytest.raises(AssertionError, match="ruler_vt needs lengths of at least 1024"):  # lm-eval would loop forever
        run_cli([sys.executable, str(REPO / "scripts" / "lm_eval_ruler.py"), str(directory), "--lengths", "512,1024",
                 "--out", str(tmp_path / "short")], env=dict(hf_env))


def test_lm_eval_ruler_puts_lex_ruler_greedy_beside_it(tmp_path):
    """scripts/lm_eval_ruler.py reads a lex ruler report: each length's greedy string_match_all averaged over the
    depths that fitted, under the window asked; a window the report lacks is refused before lm-eval runs."""
    import importlib.util

    from click.testing import CliRunner

    spec = importlib.util.spec_from_file_location("lm_eval_ruler", REPO / "scripts" / "lm_eval_ruler.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)

    def cell(window, length, depth, greedy, trials=4, queries=4):
        return {"task": "vt", "window": window, "length": length, "depth": depth, "trials": trials, "queries": queries,
                "greedy": greedy}

    report = {"results": [cell("full", 896, 0.1, 2.0), cell("full", 896, 0.9, 0.0), cell("full", 1920, 0.5, 0.0, trials=0),
                          cell("bca(128)", 896, 0.1, 4.0)]}
    assert script.lex_greedy(report, "full") == {"vt": {896: 0.25}}  # the cell that did not fit is left out
    assert script.lex_greedy(report, "bca") == {"vt": {896: 1.0}}
    path = tmp_path / "ruler.json"
    path.write_text(json.dumps(report))
    refused = CliRunner().invoke(script.main, [str(tmp_path), "--lengths", "1024", "--out", str(tmp_path / "o"),
                                               "--lex-ruler", str(path), "--lex-window", "sliding"])
    assert refused.exit_code == 2 and "no scored row under the window 'sliding'" in refused.output
    mismatched = CliRunner().invoke(script.main, [str(tmp_path), "--lengths", "1024,2048", "--out", str(tmp_path / "o"),
                                                  "--lex-ruler", str(path), "--lex-lengths", "896"])
    assert mismatched.exit_code == 2 and "one lex ruler length per lm-eval length" in mismatched.output


@pytest.mark.parametrize("damage, message", [
    ("safetensors", "model.safetensors"),
    ("scheme", "pos_emb"),
    ("dict", "dict.txt"),
])
def test_corrupted_exports_fail_to_load_clearly(exports, tmp_path, hf_env, damage, message):
    import shutil

    directory = tmp_path / "broken"
    shutil.copytree(exports["alibi"][0], directory)
    if damage == "safetensors":
        (directory / "model.safetensors").unlink()
        what = "AutoModelForCausalLM"
    elif damage == "scheme":
        config = json.loads((directory / "config.json").read_text())
        config["pos_emb"] = "wavelet"
        (directory / "config.json").write_text(json.dumps(config))
        what = "AutoModelForCausalLM"
    else:
        (directory / "dict.txt").unlink()
        what = "AutoTokenizer"
    script = (f"from transformers import {what}\n{what}.from_pretrained({str(directory)!r}, trust_remote_code=True)\n")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **hf_env)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env)
    assert proc.returncode != 0
    assert message in proc.stderr.strip().splitlines()[-1], proc.stderr[-1500:]


def test_beam_search_through_the_cache_equals_beam_search_without(exports, test_tokens):
    """Beam search reorders LexCache's per-layer caches (reorder_cache); with use_cache=False every step reruns the
    whole prefix: the two must give the same beams."""
    _, model, _, _ = exports["rope"]
    prompt = test_tokens[:, :40]
    kwargs = dict(max_new_tokens=12, min_new_tokens=12, num_beams=3, num_return_sequences=3, do_sample=False,
                  eos_token_id=None, pad_token_id=1, length_penalty=0.0)
    cached = model.generate(prompt, **kwargs)
    uncached = model.generate(prompt, use_cache=False, **kwargs)
    assert torch.equal(cached, uncached)
    assert len({tuple(row.tolist()) for row in cached}) == 3


def test_logits_to_keep_gives_the_last_positions_logits(exports, test_tokens):
    _, model, _, _ = exports["xpos"]
    tokens = test_tokens[:, :80]
    with torch.no_grad():
        every = model(tokens, use_cache=False).logits
        last = model(tokens, use_cache=False, logits_to_keep=3).logits
    assert last.shape == (1, 3, every.size(-1))
    torch.testing.assert_close(last, every[:, -3:], rtol=0, atol=1e-5)  # (another matmul blocking: ~1e-6)
    with pytest.raises(ValueError, match="logits_to_keep"):
        model(tokens, labels=tokens, logits_to_keep=1)


def test_dictionary_reads_as_fairseq_reads_it(tmp_path):
    """Line separators other than a newline stay inside a symbol, trailing blanks go, and a symbol listed again with
    #fairseq:overwrite takes a new id that its encoding uses: ids as fairseq's Dictionary gives them."""
    path = tmp_path / "dict.txt"
    path.write_bytes("a 5\nb\u2028c 4\nd  3 \na 2 #fairseq:overwrite\ne\x85 1\r\nf 1\n".encode("utf-8"))
    expected = Dictionary.load(str(path))
    symbols = read_fairseq_dictionary(path)
    assert symbols == expected.symbols
    tok = LexTokenizer(str(path), None)
    assert tok.convert_tokens_to_ids(["a", "b\u2028c", "f"]) == [expected.index("a"), expected.index("b\u2028c"), expected.index("f")]
    assert tok.convert_tokens_to_ids("a") == 7  # the overwriting entry
    path.write_text("a 5\na 3\n", encoding="utf-8")
    with pytest.raises(ValueError, match="duplicate symbol 'a'"):
        read_fairseq_dictionary(path)
    path.write_text("a five\n", encoding="utf-8")
    with pytest.raises(ValueError, match="expected 'symbol count"):
        read_fairseq_dictionary(path)


def test_left_padded_batch_generates_as_each_row_alone_or_is_refused(exports, test_tokens):
    """Batched generate() pads shorter prompts on the left: under RoPE with full attention each row's tokens equal
    that row generated alone; under BCA, whose blocks count positions from the first, the batch is refused."""
    _, model, _, _ = exports["rope"]
    pad = model.config.pad_token_id
    long, short = test_tokens[:, :30], test_tokens[:, 100:122]
    batch = torch.cat([long, torch.cat([torch.full((1, 8), pad), short], 1)])
    mask = batch.ne(pad).long()
    kwargs = dict(max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=pad)
    together = model.generate(batch, attention_mask=mask, **kwargs)
    assert torch.equal(together[0, 30:], model.generate(long, **kwargs)[0, 30:])
    assert torch.equal(together[1, 30:], model.generate(short, **kwargs)[0, 22:])
    bca = model.spec.__class__(window=hub_window("bca"))
    with pytest.raises(ValueError, match="left padding shifts"):
        model(batch, attention_mask=mask, spec=bca)
    right = torch.cat([long, torch.cat([short, torch.full((1, 8), pad)], 1)])  # right padding (scoring) is accepted
    with torch.no_grad():
        scored = model(right, attention_mask=right.ne(pad).long(), spec=bca, use_cache=False).logits
        alone = model(short, spec=bca, use_cache=False).logits
    torch.testing.assert_close(scored[1, :22], alone[0], rtol=0, atol=1e-5)


def hub_window(mode):
    return AttentionOptions(mode).spec(L).window


def test_export_records_a_random_positions_table_and_force_clears_stale_files(scheme_checkpoints, data_bin, tmp_path):
    """A learned table trained with --random-positions 4l has 4l rows: the export records them (its logits at 2l equal
    fairseq's). Re-exporting with --force removes the earlier export's files (a scaling file it no longer uses)."""
    state = torch.load(scheme_checkpoints["learned"], map_location="cpu", weights_only=False)
    state["cfg"]["model"] = dict(state["cfg"]["model"], random_positions=4 * L)
    dictionary = Dictionary.load(str(data_bin / "dict.txt"))
    fresh = build_lex_model("lex_lm_tiny", dictionary, seed=5, pos_emb="learned", tokens_per_sample=L,
                            random_positions=4 * L, share_decoder_input_output_embed=True)
    state["model"] = {**state["model"], **{k: v for k, v in fresh.state_dict().items() if k.startswith("decoder.positions.")}}
    ckpt = tmp_path / "learned_random" / "checkpoint_last.pt"
    ckpt.parent.mkdir()
    torch.save(state, ckpt)
    out = tmp_path / "hf"
    model = export_hf(ckpt, data_bin, out)
    config = json.loads((out / "config.json").read_text())
    assert config["position_options"]["max_target_positions"] == 4 * L
    hub = from_pretrained(ckpt.parent, ckpt.name, data_bin)
    tokens = torch.randint(4, len(dictionary), (1, 2 * L), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, use_cache=False).logits, hub.models[0](tokens)[0], rtol=0, atol=1e-5)

    rope = scheme_checkpoints["rope"]
    export_hf(rope, data_bin, tmp_path / "rope", AttentionOptions("bca"))
    (tmp_path / "rope" / "rope_scaling.json").write_text("{}")  # as an export with a scaling file leaves it
    (tmp_path / "rope" / "notes.md").write_text("mine")
    with pytest.raises(FileExistsError, match="--force"):
        export_hf(rope, data_bin, tmp_path / "rope")
    with pytest.raises(ValueError, match="mode"):  # refused before anything is written
        export_hf(rope, data_bin, tmp_path / "rope", AttentionOptions("nonsense"), force=True)
    assert (tmp_path / "rope" / "rope_scaling.json").is_file()
    export_hf(rope, data_bin, tmp_path / "rope", force=True)
    assert not (tmp_path / "rope" / "rope_scaling.json").exists()
    assert (tmp_path / "rope" / "notes.md").read_text() == "mine"
    assert json.loads((tmp_path / "rope" / "config.json").read_text())["attention"] == {}


def test_prompt_ids_and_the_cache_after_a_prefill(exports, data_bin, test_tokens):
    """A prompt's ids are lex generate's ([</s>] + the text's ids, no closing </s>) from encode_prompt and from
    tokenizer(prompt); a document ending with a line break ends with </s>. After a prefill of T tokens the cache
    holds T positions and generation feeds exactly one token next; scores through the cache equal a forward
    without it (1e-4) at every step, under full attention and BCA."""
    directory, model, hub, _ = exports["xpos"]
    tok = LexTokenizer(str(directory / "dict.txt"), str(directory / "spm.model"), bpe="sentencepiece")
    prompt = "It was the best of times, it was the worst of times"
    expected = [hub.src_dict.eos()] + hub.encode(prompt)[:-1].tolist()
    assert tok.encode_prompt(prompt) == expected == tok(prompt).input_ids
    assert tok.encode_prompt(prompt + "\n") == expected
    assert tok(prompt + "\n").input_ids == expected + [hub.src_dict.eos()]
    for spec in (None, model.spec.__class__(window=hub_window("bca"))):
        prefix = test_tokens[:, : 2 * L + 3]
        cache = LexCache()
        with torch.no_grad():
            model(prefix, past_key_values=cache, spec=spec)
        assert cache.get_seq_length() == prefix.size(1)
        longer = torch.cat([prefix, test_tokens[:, 2 * L + 3 : 2 * L + 4]], 1)
        assert model.prepare_inputs_for_generation(longer, past_key_values=cache)["input_ids"].shape == (1, 1)
        steps = []
        with torch.no_grad():
            for t in range(2 * L + 3, 2 * L + 3 + 12):
                steps.append(model(test_tokens[:, t : t + 1], past_key_values=cache, spec=spec).logits[0, -1])
            full = model(test_tokens[:, : 2 * L + 15], use_cache=False, spec=spec).logits[0, 2 * L + 3 :]
        torch.testing.assert_close(torch.stack(steps), full, rtol=0, atol=1e-4)
        assert cache.get_seq_length() == 2 * L + 15


def test_honest_arguments(exports, test_tokens):
    """return_dict=False gives a tuple; output_attentions and foreign position_ids are refused, the model's own
    positions accepted; gradient checkpointing gives the gradients of a plain backward pass."""
    _, model, _, _ = exports["rope"]
    ids = test_tokens[:, :50]
    with torch.no_grad():
        out = model(ids, use_cache=False)
        as_tuple = model(ids, use_cache=False, return_dict=False)
    assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], out.logits)
    with pytest.raises(ValueError, match="output_attentions"):
        model(ids, output_attentions=True)
    with pytest.raises(ValueError, match="position_ids"):
        model(ids, position_ids=torch.arange(1, 51)[None])
    with torch.no_grad():
        own = model(ids, use_cache=False, position_ids=torch.arange(50)[None]).logits
    assert torch.equal(own, out.logits)
    with pytest.raises(TypeError, match="atention_mask"):  # misspelt: refused, not ignored
        model(ids, atention_mask=torch.ones_like(ids))
    from lex_plugin.hf.modeling import LexModel

    body = LexModel(model.config)
    body.decoder = model.decoder
    with torch.no_grad():
        assert torch.equal(model.decoder.output_layer(body(ids, use_cache=False).last_hidden_state), out.logits)
    with pytest.raises(TypeError, match="labels"):  # the head's: LexModel gives hidden states
        body(ids, labels=ids)
    import copy

    trained = copy.deepcopy(model).train()
    grads = []
    for checkpointing in (False, True):
        trained.zero_grad()
        if checkpointing:
            trained.gradient_checkpointing_enable()
        trained(ids, labels=ids).loss.backward()
        grads.append([p.grad.clone() for p in trained.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 10
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)
    assert trained.decoder.gradient_checkpointing
    # checkpointing recomputes: each layer's forward runs again in the backward pass, its activations not kept
    calls = []
    hook = trained.decoder.layers[0].register_forward_hook(lambda *_: calls.append(torch.is_grad_enabled()))
    for checkpointing, runs in ((True, 2), (False, 1)):
        calls.clear()
        trained.gradient_checkpointing_enable() if checkpointing else trained.gradient_checkpointing_disable()
        trained(ids, labels=ids).loss.backward()
        assert len(calls) == runs, (checkpointing, calls)
    hook.remove()


def test_position_ids_are_checked_against_the_cached_positions(exports, test_tokens):
    """After 10 cached tokens the next one is at position 10: ``[[10]]`` is accepted (and equals no position_ids),
    ``[[0]]`` refused."""
    _, model, _, _ = exports["rope"]
    ids = test_tokens[:, :11]
    with torch.no_grad():
        cache = model(ids[:, :10], use_cache=True).past_key_values
        with pytest.raises(ValueError, match="position_ids must be the positions the model counts itself"):
            model(ids[:, 10:], past_key_values=cache, position_ids=torch.tensor([[0]]))
        assert cache.get_seq_length() == 10
        own = model(ids[:, 10:], past_key_values=cache, position_ids=torch.tensor([[10]])).logits
        full = model(ids, use_cache=False).logits[:, 10:]
    torch.testing.assert_close(own, full, rtol=0, atol=1e-4)


def test_export_files_config_and_card(exports, scheme_checkpoints, data_bin, tmp_path):
    """Every file 0644; the sliding window an int; max_position_embeddings 16 l by default (a learned table's size
    for learned positions; as given otherwise); the card carries the Hub's metadata, the scheme, l, the attention
    and, given a length report, its perplexity table."""
    directory = exports["xpos"][0]
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in directory.iterdir())
    config = json.loads((directory / "config.json").read_text())
    assert config["max_position_embeddings"] == 16 * L
    assert config["auto_map"]["AutoModel"] == "modeling_lex.LexModel"
    assert json.loads((exports["learned"][0] / "config.json").read_text())["max_position_embeddings"] == L
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"training_length": L, "split": "test", "split_tokens": 1000, "results": [
        {"window": "full", "length": L, "ppl": 50.0}, {"window": "full", "length": 4 * L, "ppl": 80.5},
        {"window": "bca", "length": 4 * L, "ppl": 48.25},
        # --fixed-target-tokens' rows carry the same labels: the card is the stream protocol's table
        {"window": "full", "length": L, "ppl": 61.0, "protocol": "fixed_target"},
        {"window": "full", "length": 4 * L, "ppl": 70.0, "protocol": "fixed_target"}]}))
    out = tmp_path / "hf"
    export_hf(scheme_checkpoints["alibi"], data_bin, out, AttentionOptions("sliding", "48"), max_position_embeddings=1000,
              length_report=report)
    config = json.loads((out / "config.json").read_text())
    assert config["attention"] == {"mode": "sliding", "sliding_window": 48} and config["max_position_embeddings"] == 1000
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n") and "- alibi" in card
    assert f"| training length l | {L} tokens |" in card and "sliding(48)" in card
    assert f"| window | {L} (1l) | {4 * L} (4l) |" in card and "| full | 50.00 | 80.50 |" in card and "| bca | - | 48.25 |" in card
    assert "61.00" not in card and "Moses + SentencePiece" in card
    # the Hub's evaluation metadata: the same figures, one perplexity metric per window and length
    import yaml

    meta = yaml.safe_load(card.split("---\n")[1])
    [result] = meta["model-index"][0]["results"]
    assert meta["model-index"][0]["name"] == "hf"  # the export directory's name
    assert result["dataset"]["split"] == "test" and result["dataset"]["config"] == "stream"
    assert result["task"]["type"] == "text-generation"
    assert [(m["type"], m["value"], m["name"]) for m in result["metrics"]] == [
        ("perplexity", 50.0, f"test perplexity at {L} tokens (1l), full"),
        ("perplexity", 80.5, f"test perplexity at {4 * L} tokens (4l), full"),
        ("perplexity", 48.25, f"test perplexity at {4 * L} tokens (4l), bca")]
    with pytest.raises(ValueError, match="max-position-embeddings"):
        export_hf(scheme_checkpoints["learned"], data_bin, tmp_path / "learned", max_position_embeddings=L + 1)


def test_a_data_bin_without_its_tokenization_record_is_refused(scheme_checkpoints, data_bin, tmp_path):
    """Without lex_prepare.json the hub takes text as already tokenized: no export tokenizer could match it."""
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("dict.txt", "spm.model"):
        shutil.copyfile(data_bin / name, bare / name)
    with pytest.raises(FileNotFoundError, match="lex_prepare.json"):
        export_hf(scheme_checkpoints["xpos"], bare, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_tokenizer_names_a_missing_file_first(exports, tmp_path):
    import shutil

    directory = shutil.copytree(exports["xpos"][0], tmp_path / "copy")
    (directory / "spm.model").unlink()
    with pytest.raises(ValueError, match="needs spm.model"):
        LexTokenizer.from_pretrained(str(directory))
    (directory / "dict.txt").unlink()
    with pytest.raises(ValueError, match="needs dict.txt"):
        LexTokenizer.from_pretrained(str(directory))


def test_a_model_built_on_the_meta_device_equals_the_export(exports, test_tokens):
    """transformers 5 builds a model under ``torch.device("meta")`` and then loads its weights: every scheme's
    position tables (plain tensors, not weights) must still be made on the CPU, so that the model built that way
    and given the weights computes the export's logits."""
    from lex_plugin.hf import LexForCausalLM

    for name, (_, model, _, _) in exports.items():
        with torch.device("meta"):
            built = LexForCausalLM(model.config)
        built = built.to_empty(device="cpu").eval()
        built.load_state_dict(model.state_dict())
        n = L if name == "learned" else 2 * L
        with torch.no_grad():
            torch.testing.assert_close(built(test_tokens[:, :n], use_cache=False).logits,
                                       model(test_tokens[:, :n], use_cache=False).logits, rtol=0, atol=0, msg=name)


def test_the_cache_under_either_name(exports, test_tokens):
    """transformers 5 passes the cache as ``cache``, 4.x as ``past_key_values``: either is taken (both at once is
    refused), and generation's inputs name it as the installed version does."""
    from lex_plugin.hf.modeling import CACHE_FIELD

    _, model, _, _ = exports["rope"]
    ids = test_tokens[:, :20]
    with torch.no_grad():
        cache = LexCache()
        model(ids[:, :12], cache=cache)
        step = model(ids[:, 12:13], cache=cache).logits[0, -1]
        full = model(ids[:, :13], use_cache=False).logits[0, -1]
    torch.testing.assert_close(step, full, rtol=0, atol=1e-4)
    inputs = model.prepare_inputs_for_generation(ids[:, :14], cache=cache)
    assert inputs[CACHE_FIELD] is cache and inputs["input_ids"].shape == (1, 1)
    with pytest.raises(ValueError, match="give the cache once"):
        model(ids[:, 13:14], cache=cache, past_key_values=cache)


@pytest.mark.parametrize("layout", [
    dict(pos_emb="rope", subln=True, no_scale_embedding=True, layernorm_eps=1e-6, layer_pattern="rope/bca,none/full"),
    dict(pos_emb="alibi", post_ln=True, share_decoder_input_output_embed=True, layernorm_embedding=True,
         activation_fn="relu", decoder_embed_dim=96, decoder_ffn_embed_dim=160, decoder_attention_heads=3),
    dict(pos_emb="xpos", deepnorm=True, activation_fn="swish", qk_norm=True, learned_sinks=True)], ids=str)
def test_every_model_field_round_trips_fairseq_hf_fairseq(layout):
    """fairseq options -> decoder config -> LexConfig (export) -> config.json -> LexConfig -> decoder config (load):
    every field of ``MODEL_FIELDS`` with an HF name comes back with its value (the negated one included), the
    designs' options too, and the training-only fields at their inference values."""
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY

    from lex_plugin.export.hf import hf_config
    from lex_plugin.hf.configuration import LexConfig
    from lex_plugin.models.lex_lm import build_decoder_config
    from lex_plugin.modules.designs import DESIGN_OPTIONS
    from lex_plugin.modules.model_fields import MODEL_FIELDS

    dictionary = Dictionary()
    for i in range(50):
        dictionary.add_symbol(f"w{i}")
    args = argparse.Namespace(arch="lex_lm_tiny", tokens_per_sample=64, decoder_layers=3, dropout=0.3, **layout)
    ARCH_CONFIG_REGISTRY["lex_lm_tiny"](args)
    built = build_decoder_config(args, len(dictionary))
    exported = hf_config(args, dictionary, 64)
    loaded = LexConfig(**json.loads(exported.to_json_string())).decoder_config()
    fields = [f.name for f in MODEL_FIELDS.values() if f.hf]
    assert [getattr(loaded, n) for n in fields] == [getattr(built, n) for n in fields]
    for name, value in layout.items():  # each value given comes back (--post-ln as normalize_before, below)
        assert name == "post_ln" or getattr(loaded, name) == value, name
    assert [getattr(loaded, n) for n in DESIGN_OPTIONS] == [getattr(built, n) for n in DESIGN_OPTIONS]
    assert (loaded.decoder_layers, loaded.tokens_per_sample, loaded.vocab_size) == (3, 64, len(dictionary))
    assert loaded.decoder_normalize_before == (not (layout.get("post_ln") or layout.get("deepnorm")))
    assert (built.dropout, loaded.dropout, loaded.random_positions) == (0.3, 0.0, 0)


def test_the_fairseq_options_are_the_table_and_the_registries():
    """fairseq's ``--arch lex_lm`` dataclass holds exactly the options ``model_options()`` lists (the model's
    fields, each scheme's, each design's) and the training length, with the table's defaults."""
    import dataclasses

    from lex_plugin.models.lex_lm import LexLanguageModelConfig
    from lex_plugin.modules.model_fields import MODEL_FIELDS, model_options

    fields = {f.name: f for f in dataclasses.fields(LexLanguageModelConfig)}
    assert set(fields) - {"tokens_per_sample", "_name"} == {name for name, _, _ in model_options()}
    for f in MODEL_FIELDS.values():
        if f.option:
            assert fields[f.name].default == f.default, f.name


def test_lex_export_hf_takes_the_data_bin_first_and_the_old_form_with_a_warning(scheme_checkpoints, data_bin, tmp_path):
    """lex export-hf DATA OUT --path CKPT, as every lex command; CKPT OUT --data DATA still works (deprecated, said on
    stderr) and writes the same weights; mixing the forms, or a checkpoint missing, is refused."""
    from click.testing import CliRunner
    from safetensors.torch import load_file

    from lex_plugin.cli import main

    ckpt = scheme_checkpoints["rope"]
    new = CliRunner().invoke(main, ["export-hf", str(data_bin), str(tmp_path / "new"), "--path", str(ckpt)])
    assert new.exit_code == 0 and "deprecated" not in new.stderr, new.output + new.stderr
    old = CliRunner().invoke(main, ["export-hf", str(ckpt), str(tmp_path / "old"), "--data", str(data_bin)])
    assert old.exit_code == 0 and "deprecated" in old.stderr, old.output + old.stderr
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("new", "old"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for args, message in [([str(data_bin), str(tmp_path / "x"), "--path", str(ckpt), "--data", str(data_bin)], "give the data-bin once"),
                          ([str(data_bin), str(tmp_path / "x")], "give the checkpoint"),
                          ([str(ckpt), str(tmp_path / "x"), "--path", str(ckpt)], "is not a directory"),
                          ([str(data_bin), str(tmp_path / "x"), "--data", str(data_bin)], "is not a file")]:
        result = CliRunner().invoke(main, ["export-hf", *args])
        assert result.exit_code == 2 and message in result.output, (args, result.output)
    assert not (tmp_path / "x").exists()


def test_lex_export_hf_carries_a_probe_report_of_the_exported_checkpoint(scheme_checkpoints, data_bin, tmp_path):
    """As a user runs it: lex passkey --json on a checkpoint, then lex export-hf --probe-report: the card's passkey
    table, its model-index (read back with huggingface_hub) and its definitions table hold the report's figures, worked
    out here from its raw rows; the report names the exported checkpoint, and its provenance (this commit) follows the
    table. A probe's report given as --length-report is refused before anything is written."""
    from click.testing import CliRunner
    from huggingface_hub import ModelCard

    from lex_plugin.cli import main

    ckpt, report, out = scheme_checkpoints["rope"], tmp_path / "passkey.json", tmp_path / "hf"
    probe = CliRunner().invoke(main, ["passkey", str(data_bin), "--path", str(ckpt), "--lengths", f"{2 * L},{16 * L}",
                                      "--depths", "0.5", "--trials", "3", "--json", str(report)])
    assert probe.exit_code == 0, probe.output
    exported = CliRunner().invoke(main, ["export-hf", str(data_bin), str(out), "--path", str(ckpt),
                                         "--probe-report", str(report)])
    assert exported.exit_code == 0, exported.output + exported.stderr
    card = (out / "README.md").read_text()
    raw = json.loads(report.read_text())
    results = {r.metric_name: r.metric_value for r in ModelCard(card).data.eval_results}
    for n in (2 * L, 16 * L):  # a prompt needs 104 tokens or more
        [row] = [r for r in raw["results"] if r["length"] == n and r["attention"]["mode"] == "full"]
        at = f"(3 prompts) at {n} tokens ({n // L}l), full"
        assert results[f"passkey ranked first among 10 {at}"] == round(row["retrieved"] / 3, 4)
        assert results[f"greedy passkey written whole {at}"] == round(row["greedy"] / 3, 4)
    greedy = next(r for r in raw["results"] if r["length"] == 16 * L and r["attention"]["mode"] == "full")["greedy"] / 3
    assert f"| retrieves | greedy passkey at 16l >= 0.90 | {greedy:.4f} |" in card
    assert "The report names the exported checkpoint." in card and "(another checkpoint)" not in card
    assert f"commit {raw['provenance']['commit'][:10]}" in card and "`lex passkey" not in card.split("## Use")[0]
    refused = CliRunner().invoke(main, ["export-hf", str(data_bin), str(tmp_path / "x"), "--path", str(ckpt),
                                        "--length-report", str(report)])
    assert refused.exit_code == 1 and "give it as --probe-report" in refused.output
    assert not (tmp_path / "x").exists()
