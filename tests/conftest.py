"""Shared fixtures: the real corpus (../shared/data, never committed) and small LeX models; the suite's two tiers.

The tiers: ``make test`` runs every test; ``make test-fast`` (``LEX_TEST_TIER=fast``, ``-m "not e2e"``) runs those
that train nothing and start no process. A test is end-to-end (marked ``e2e``) when it asks for a fixture that
prepares or trains (:data:`E2E_FIXTURES`) or is marked so by hand; in the fast tier any other test that starts a
process (fairseq-train, a ``lex`` command, a script) fails, naming the marker it needs.
"""

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
from fairseq.data import Dictionary

import lex_plugin  # noqa: F401  (registers lex_lm)
from lex_plugin.models.builder import build_random_lm
from lex_plugin.modules.autocast import EMULATED_BF16_ENV

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("LEX_SHARED_DATA", REPO.parent / "shared" / "data"))

# fixtures that prepare the corpus or train a model: a test that asks for one is end-to-end
E2E_FIXTURES = frozenset({"pg_slice", "data_bin", "trained", "hub", "filler", "real_batches"})
FAST_TIER = os.environ.get("LEX_TEST_TIER") == "fast"


def pytest_configure(config):
    config.addinivalue_line("markers", "e2e: prepares data, trains a model or starts a process; left out of make test-fast")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if E2E_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)


_POPEN = subprocess.Popen


class _NoProcess(_POPEN):
    """subprocess.Popen in the fast tier: git (a report's provenance) only."""

    def __init__(self, *args, **kwargs):
        command = args[0] if args else kwargs.get("args")
        if isinstance(command, (list, tuple)) and command and command[0] == "git":
            super().__init__(*args, **kwargs)
            return
        raise AssertionError(f"the fast tier starts no process ({command!r}): mark the "
                             "test @pytest.mark.e2e, or test the module in this process")


@pytest.fixture(autouse=True)
def _fast_tier_starts_no_process(request, monkeypatch):
    """In the fast tier, a test not marked e2e that starts a process but git fails (subprocess.Popen refused)."""
    if FAST_TIER and request.node.get_closest_marker("e2e") is None:
        monkeypatch.setattr(subprocess, "Popen", _NoProcess)
    yield


def shared_data() -> Path:
    if not (SHARED_DATA / "pg" / "train").is_dir():
        pytest.fail(f"real corpus not found at {SHARED_DATA} (set LEX_SHARED_DATA to shared/data)")
    return SHARED_DATA


@pytest.fixture(scope="session")
def pg_slice(tmp_path_factory) -> Path:
    """A small real slice of the book corpus: 3 train books, 1 valid, 1 test, each cut to its first
    60k characters (a prepare + train + eval round trip fits in CI's time)."""
    src = shared_data() / "pg"
    dst = tmp_path_factory.mktemp("pg_slice")
    picks = {"train": 3, "valid": 1, "test": 1}
    for split, n in picks.items():
        (dst / split).mkdir()
        for path in sorted((src / split).glob("*.txt"))[:n]:
            (dst / split / path.name).write_text(path.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    return dst


# lex commands run_cli starts as processes: prepare's pool of workers, and train, which replaces its process with
# fairseq-train (os.execvp); every other `python -m lex_plugin.cli CMD` runs in this process
LEX_SUBPROCESS = {"prepare", "train"}
# fairseq commands run_cli runs in this process (through reproduce's in-process steps), unless they start workers or
# set the thread count (a bitwise comparison with a process of that many threads)
FAIRSEQ_IN_PROCESS = ("fairseq-train", "fairseq-eval-lm")
# scripts whose click command run_cli runs in this process (their steps still start their own processes)
IN_PROCESS_SCRIPTS = ("reproduce.py", "paper_table2.py")


def run_cli(args, env=None, **kwargs) -> subprocess.CompletedProcess:
    """Run a command with this interpreter's scripts first on PATH (``env``: more variables); fail with
    its output on error.

    ``python -m lex_plugin.cli CMD ...`` (CMD not in :data:`LEX_SUBPROCESS`) and ``python scripts/NAME ...`` (NAME in
    :data:`IN_PROCESS_SCRIPTS`) run in this process through click's CliRunner (``timeout`` then unused): the same
    command and options, its stdout and stderr (the log) kept apart, without the ~7 s of a new interpreter importing
    torch and fairseq. ``fairseq-train`` and ``fairseq-eval-lm`` run in this process too (:func:`_invoke_fairseq`)
    unless they are distributed or ``env`` sets the thread count. The data-bin fixture's prepare and the tests that
    expect a failure still start real processes."""
    args = [str(a) for a in args]
    command = _in_process_command(args) if set(kwargs) <= {"timeout"} else None
    if command is not None:
        return _invoke(*command, args, env)
    if (args[0] in FAIRSEQ_IN_PROCESS and set(kwargs) <= {"timeout"} and "OMP_NUM_THREADS" not in (env or {})
            and not any(a.startswith("--distributed") for a in args)):
        return _invoke_fairseq(args, env)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **(env or {}))
    env.setdefault("OMP_NUM_THREADS", "2")
    proc = subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, **kwargs)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, args))} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def _in_process_command(args):
    """(click command, its arguments, its name) for a command run_cli runs in this process, else None."""
    if args[:3] == [sys.executable, "-m", "lex_plugin.cli"] and len(args) > 3 and args[3] not in LEX_SUBPROCESS:
        from lex_plugin.cli import main

        return main, args[3:], "lex"
    if len(args) > 1 and args[0] == sys.executable and Path(args[1]).parent == REPO / "scripts" and Path(args[1]).name in IN_PROCESS_SCRIPTS:
        return _script(Path(args[1]).name).main, args[2:], Path(args[1]).name
    return None


@functools.lru_cache(maxsize=None)
def _script(name: str):
    """The module of scripts/NAME, loaded once."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_script_{Path(name).stem}", REPO / "scripts" / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _invoke(command, arguments, name, args, env) -> subprocess.CompletedProcess:
    """``command`` on ``arguments`` in this process, from the repository root, with this interpreter's scripts first on
    PATH (``env``: more variables) and ``sys.argv`` the command line it would have had (a report's provenance reads
    it); the root logger a command configures (``logging.basicConfig(force=True)``) is put back after it."""
    import logging
    import traceback

    from click.testing import CliRunner

    root, cwd, argv = logging.getLogger(), os.getcwd(), sys.argv
    handlers, level = root.handlers[:], root.level
    env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", **(env or {})}
    os.chdir(REPO)
    sys.argv = [name, *arguments]
    try:
        result = CliRunner().invoke(command, arguments, env=env, prog_name=name)
    finally:
        sys.argv = argv
        os.chdir(cwd)
        root.handlers[:] = handlers
        root.setLevel(level)
    if result.exit_code != 0:
        trace = "".join(traceback.format_exception(*result.exc_info)) if result.exc_info else ""
        raise AssertionError(f"{name} {' '.join(arguments)} failed ({result.exit_code}):\n{result.stdout[-3000:]}\n"
                             f"{result.stderr[-5000:]}\n{trace[-3000:]}")
    return subprocess.CompletedProcess(args, 0, result.stdout, result.stderr)


def _invoke_fairseq(args, env) -> subprocess.CompletedProcess:
    """fairseq-train / fairseq-eval-lm ``args`` in this process (``lex_plugin.experiments.reproduce.in_process``), from
    the repository root, with ``env`` set for its duration: stdout holds its whole output (its log included), stderr
    is empty."""
    import io

    from lex_plugin.experiments.reproduce.in_process import run_in_process

    out, saved = io.StringIO(), {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        rc = run_in_process(args, out, REPO)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    if rc != 0:
        raise AssertionError(f"{' '.join(args)} failed ({rc}):\n{out.getvalue()[-8000:]}")
    return subprocess.CompletedProcess(args, 0, out.getvalue(), "")


def make_dictionary(size: int = 100) -> Dictionary:
    d = Dictionary()
    for i in range(size):
        d.add_symbol(f"w{i}")
    return d


def build_lex_model(arch: str = "lex_lm_tiny", dictionary: Dictionary = None, seed: int = 0, **overrides):
    """A randomly initialised lex_lm in eval mode, fp32, built the way fairseq-train builds it (see
    ``lex_plugin.models.builder.build_random_lm``; without ``dictionary``, ``make_dictionary()``'s)."""
    return build_random_lm(arch, dictionary or make_dictionary(), seed=seed, **overrides)[0]


def window_mask(window, length: int) -> torch.Tensor:
    """The explicit (length, length) boolean mask of an ``AttentionWindow`` (True = may attend): O(L^2), the
    reference the planned attention is checked against."""
    i = torch.arange(length)
    return window.allowed(i[:, None], i[None, :])


def random_tokens(dictionary: Dictionary, bsz: int, length: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(dictionary.nspecial, len(dictionary), (bsz, length), generator=g)


TRAIN_LEN = 64  # training length of the small real-text model shared by the CLI and generation tests


@pytest.fixture(scope="session")
def data_bin(pg_slice, tmp_path_factory):
    dest = tmp_path_factory.mktemp("e2e") / "data-bin"
    run_cli([sys.executable, "-m", "lex_plugin.cli", "prepare", str(pg_slice), str(dest), "--vocab-size", "1000", "--workers", "2"])
    return dest


@pytest.fixture(scope="session")
def trained(data_bin, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("ckpt")
    proc = run_cli(
        [
            "fairseq-train", str(data_bin), "--user-dir", str(REPO / "lex_plugin"), "--task", "language_modeling",
            "--arch", "lex_lm_tiny", "--share-decoder-input-output-embed",
            "--tokens-per-sample", str(TRAIN_LEN), "--sample-break-mode", "none", "--batch-size", "8",
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "2e-3", "--lr-scheduler", "inverse_sqrt",
            "--warmup-updates", "5", "--clip-norm", "1.0", "--max-update", "30", "--save-dir", str(save_dir),
            "--no-epoch-checkpoints", "--disable-validation", "--log-format", "json", "--log-interval", "1",
            "--num-workers", "0", "--seed", "1",
        ]
    )
    losses = [float(json.loads(m)["loss"]) for m in re.findall(r"train_inner \| (\{.*\})", proc.stdout + proc.stderr)]
    return save_dir / "checkpoint_last.pt", losses


@pytest.fixture(scope="module")
def hub(trained, data_bin):
    """The suite's trained model (``trained``) as a hub over its data-bin: full attention, fp32."""
    import lex_plugin

    ckpt, _ = trained
    return lex_plugin.from_pretrained(ckpt.parent, ckpt.name, data_bin)


@pytest.fixture(scope="module")
def filler(hub, data_bin):
    """(T,) the data-bin's test split as one token stream: the probes' book text."""
    from lex_plugin.data.stream import split_stream

    return split_stream(data_bin, "test", hub.src_dict)


@pytest.fixture(scope="session")
def real_batches(data_bin):
    """(N, 65) consecutive token windows of the real training split (BPE 1000), and its dictionary."""
    from fairseq.data import data_utils

    d = Dictionary.load(str(data_bin / "dict.txt"))
    ds = data_utils.load_indexed_dataset(str(data_bin / "train"), d)
    stream = torch.cat([ds[i].long() for i in range(len(ds))])
    n = stream.numel() // 65
    return stream[: n * 65].view(n, 65), d


def xpos_pair(xpos, q, k, q_start: int, k_start: int = 0):
    """xPos on the queries (at q_start ..) and keys (at k_start ..) of one attention call, with one shared
    centre (the middle of the keys, rounded as the executor rounds it)."""
    from lex_plugin.modules.positions.xpos import CENTER_STEP

    center = (k_start + k.size(-2) // 2) // CENTER_STEP * CENTER_STEP
    return xpos.rotate(q, start=q_start, center=center), xpos.rotate(k, start=k_start, center=center, keys=True)


def run_attention(q, k, v, window, scheme=None, key_padding_mask=None, **plan_options):
    """Attention of queries and keys at positions 0 .. L-1 through the package's one path: the planner
    and the executor (q, k, v (B, H, L, D) before any rotation; ``scheme`` a position scheme or None)."""
    from lex_plugin.modules.attention import AttentionSpec, HeldKeys, attend, plan
    from lex_plugin.modules.positions import NoPositions

    scheme = scheme if scheme is not None else NoPositions()
    chunks = plan(window, q_len=q.size(2), has_bias=scheme.kind == "bias" or window.sinks > 0,
                  padded=key_padding_mask is not None, batch_heads=q.size(0) * q.size(1),
                  local_positions=scheme.translation_invariant, **plan_options)
    return attend(q, HeldKeys(k, v, key_padding_mask), chunks, spec=AttentionSpec(window), scheme=scheme)


def heads64(x: torch.Tensor, proj: torch.nn.Linear, num_heads: int) -> torch.Tensor:
    """(B, T, C) ``x`` through ``proj`` in float64, split into heads: (B, H, T, d) (the float64 references' q, k, v)."""
    B, T, _ = x.shape
    out = x.double() @ proj.weight.double().T + proj.bias.double()
    return out.view(B, T, num_heads, -1).transpose(1, 2)


def check_against_float64(module, got: torch.Tensor, expected: torch.Tensor, params, atol: float = 1e-5) -> list:
    """``got`` (the module's output) within 1e-5 of its float64 reference ``expected``, and the gradients of ``params``
    (the module's own, as a list) through both within float32's reach (rtol 1e-4, ``atol``), one random output
    gradient for both. Returns the module's gradients of ``params``."""
    assert (got.double() - expected).abs().max() < 1e-5
    grad_out = torch.randn_like(got)
    got.backward(grad_out)
    mine = [p.grad.clone() for p in params]
    module.zero_grad()
    expected.backward(grad_out.double())
    for a, p in zip(mine, params):
        assert torch.allclose(a.double(), p.grad.double(), rtol=1e-4, atol=atol)
    return mine


def check_design_model(model, options: dict, training_length: int, specs=None, flips: float = 0.0) -> None:
    """A trained design's model (random weights) as users run it: token by token through the cache equal to the
    parallel forward (1e-4) under ``specs`` (default: full attention, BCA, BCA with 2 sink tokens and ReRoPE; the first
    l positions as one prefill), bf16 autocast within (``flips``: the share of positions allowed beyond it, for a design
    whose hard choice bf16's rounding can flip where random weights leave near ties: MoBA's blocks)
    bf16's reach of fp32 (0.1 in log-probabilities), and the Hugging Face export of ``options`` (the model's
    ``--arch lex_lm_tiny`` options) recording each of them and giving the same logits (1e-5)."""
    import argparse

    from lex_plugin.modules.attention import AttentionOptions, AttentionSpec, AttentionWindow

    L = training_length
    tokens = random_tokens(model.decoder.dictionary, 2, 5 * L, seed=4)
    if specs is None:
        specs = (AttentionSpec(), AttentionSpec(AttentionWindow.bca(L)), AttentionSpec(AttentionWindow.bca(L).with_sinks(2)),
                 AttentionOptions("rerope").spec(L))
    for spec in specs:
        view = model.under(spec)
        with torch.no_grad():
            parallel, _ = view(tokens)
            state: dict = {}
            steps = [view.decoder(tokens[:, :L], incremental_state=state)[0]]
            steps += [view.decoder(tokens[:, : t + 1], incremental_state=state)[0] for t in range(L, tokens.size(1))]
        assert (torch.cat(steps, 1) - parallel).abs().max() <= 1e-4, spec
    # a numerics check: bf16 emulated where the CPU has no native bf16 (the same numbers, slowly)
    with torch.no_grad(), mock.patch.dict(os.environ, {EMULATED_BF16_ENV: "1"}):
        fp32 = model(tokens)[0].log_softmax(-1)
        bf16 = model.with_autocast(torch.bfloat16)(tokens)[0].float().log_softmax(-1)
    assert torch.isfinite(bf16).all() and ((bf16 - fp32).abs().amax(-1) >= 0.1).float().mean() <= flips

    pytest.importorskip("transformers")
    from fairseq.models import ARCH_CONFIG_REGISTRY

    from lex_plugin.export.hf import from_fairseq, hf_config

    args = argparse.Namespace(arch="lex_lm_tiny", tokens_per_sample=L, **options)
    ARCH_CONFIG_REGISTRY["lex_lm_tiny"](args)
    config = hf_config(args, model.decoder.dictionary, L)
    for name, value in options.items():
        assert getattr(config.decoder_config(), name) == value, name
    hf = from_fairseq(model, config)
    with torch.no_grad():
        assert (hf(tokens).logits - model(tokens)[0]).abs().max() <= 1e-5
