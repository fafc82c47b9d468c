"""The LeX paper's extrapolation tables at CPU scale: run definitions, the commands of each step, the
resumable step runner, and the tables, claim verdicts and plot built from the finished reports.

Protocol (``scripts/reproduce.py`` is its command line): for each run (a ``--pos-emb`` scheme, an xPos
ablation, or a scheme trained with randomized positions) with the same model size, data, optimizer and token
budget, fairseq-train at training length l (:func:`train_command`), then one fairseq-eval-lm over the first
``eval_tokens`` tokens of the test split at each evaluation length and window (:func:`eval_command`, the
stream protocol of ``--task lex_language_modeling``), then ``lex resolution`` at l and 2l with full attention
and BCA (:func:`resolution_command`). On the xPos, RoPE and ALiBi checkpoints it then runs each of
:data:`METHODS` (attention sinks, LM-Infinite's Λ-shaped attention, RoPE scaling; the same lengths and tokens)
and ``lex passkey`` at l..8l (:func:`passkey_command`). :func:`write_results` turns the reports into LeX
Tables 2-5 in shape, a table per method, the passkey accuracies, the claims check, plots and a JSON of
everything.

The options dict ``o`` every function here takes holds: ``arch``, ``train_length`` (l), ``max_update``,
``batch_size``, ``lr``, ``seed``, ``lengths`` (sorted evaluation lengths, l among them), ``eval_tokens``,
``resolution_texts``, ``methods`` (names from :data:`METHODS` and ``passkey``; optional, default none) and
``passkey_trials`` (optional, default 10).
"""

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import lex_plugin

__all__ = [
    "LABELS", "METHODS", "METHOD_RUNS", "PLUGIN_DIR", "RUNS", "SINK_TOKENS", "WINDOW_LABEL", "ReproduceError",
    "Runner", "check_claims", "check_options", "eval_command", "fmt_time", "markdown_claims", "markdown_methods",
    "markdown_passkey", "markdown_ppl", "markdown_resolution", "method_command", "methods_of", "PASSKEY_FINETUNE", "PROBES",
    "finetune_command", "passkey_command", "passkey_data_command", "plot_ppl",
    "ppl_table", "prepare_command", "reproduce", "resolution_command", "train_command", "write_results",
]

PLUGIN_DIR = Path(lex_plugin.__file__).resolve().parent  # the --user-dir of every fairseq command
REPO = PLUGIN_DIR.parent  # working directory of every step

# name -> (fairseq-train arguments, role). "main" runs are the paper's Table 2 baselines; "ablation" runs
# are Table 4's xPos variants (zeta = 1 is RoPE, which the main runs already hold); "random" runs train with
# randomized positions (Ruoss et al. 2023, --random-positions L_max with L_max the longest evaluation length)
# and are evaluated like the main runs, with the ordinary positions.
RUNS: Dict[str, tuple] = {
    "xpos": (["--pos-emb", "xpos"], "main"),
    "rope": (["--pos-emb", "rope"], "main"),
    "alibi": (["--pos-emb", "alibi"], "main"),
    "sinusoidal": (["--pos-emb", "sinusoidal"], "main"),
    "sandwich": (["--pos-emb", "sandwich"], "main"),
    "xpos_no_rotation": (["--pos-emb", "xpos", "--xpos-no-rotation"], "ablation"),
    "xpos_scalar_zeta": (["--pos-emb", "xpos", "--xpos-scalar-zeta"], "ablation"),
    "none": (["--pos-emb", "none"], "main"),
    "xpos_random": (["--pos-emb", "xpos"], "random"),
    "rope_random": (["--pos-emb", "rope"], "random"),
    "alibi_random": (["--pos-emb", "alibi"], "random"),
}
SINK_TOKENS = 4  # StreamingLLM's choice
# Evaluation-time methods run on the same checkpoints (METHOD_RUNS): name -> (--eval-windows, further
# fairseq-eval-lm arguments, the window it modifies (its reference row), rotary schemes only?).
METHODS: Dict[str, tuple] = {
    "bca_sinks": ("bca", ["--sink-tokens", SINK_TOKENS], "bca", False),
    "sliding_sinks": ("sliding", ["--sink-tokens", SINK_TOKENS], "sliding", False),
    "lambda": ("lambda", [], "sliding", False),
    "linear": ("full", ["--rope-scaling", "linear", "--rope-scaling-factor", "auto"], "full", True),
    "ntk": ("full", ["--rope-scaling", "ntk", "--rope-scaling-factor", "auto"], "full", True),
    "yarn": ("full", ["--rope-scaling", "yarn", "--rope-scaling-factor", "auto"], "full", True),
}
PROBES = ("passkey", "passkey_finetuned")  # the passkey probe on each checkpoint, and after fine-tuning on its format
# Fine-tuning on the probe's own format (lex passkey-data): short prompts (at most l / 2 - 8 tokens with the key)
# make copying cheap to learn; the probe then asks how far beyond them, and beyond l, the skill carries.
PASSKEY_FINETUNE = {"samples": 10000, "updates": 600, "batch_size": 32, "lr": "2e-3"}
METHOD_RUNS = ("xpos", "rope", "alibi")  # the checkpoints every method (and the passkey probe) runs on
ROTARY_RUNS = ("xpos", "rope")
LABELS = {
    "xpos": "LeX (xPos)", "rope": "RoPE (Roformer)", "alibi": "ALiBi", "sinusoidal": "Sinusoidal (absolute)",
    "sandwich": "Sandwich", "none": "NoPE", "xpos_no_rotation": "xPos without rotation (theta = 0)",
    "xpos_scalar_zeta": "xPos with one scalar zeta", "xpos_random": "LeX (xPos), random positions",
    "rope_random": "RoPE, random positions", "alibi_random": "ALiBi, random positions",
}
WINDOW_LABEL = {
    "full": "full attention", "bca": "BCA", "sliding": "sliding window (W = l)",
    "bca_sinks": f"BCA + {SINK_TOKENS} sinks", "sliding_sinks": f"sliding window + {SINK_TOKENS} sinks",
    "lambda": "Λ-shaped (LM-Infinite)", "linear": "full + linear RoPE scaling (PI)",
    "ntk": "full + NTK-aware scaling", "yarn": "full + YaRN",
}


class ReproduceError(RuntimeError):
    """A step failed, or the work directory holds a run with other options."""


def fmt_time(seconds: float) -> str:
    """``seconds`` as ``1h05m`` (an hour or more) or ``4m07s``."""
    seconds = int(round(seconds))
    return f"{seconds // 3600}h{seconds // 60 % 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class Runner:
    """Runs one command per step, logging to a file, and keeps wall times in WORK/progress.json.

    Args:
        work: the work directory (progress.json lives there).
        steps: the number of steps, for the ``[i/steps]`` prefix of what it prints.
    """

    def __init__(self, work: Path, steps: int):
        self.work, self.steps, self.step = work, steps, 0
        self.start = time.time()
        self.progress_path = work / "progress.json"
        self.progress = json.loads(self.progress_path.read_text()) if self.progress_path.exists() else {}

    def __call__(self, key: str, cmd: Sequence, log: Path, done: Path, stamp: bool = False):
        """Run ``cmd`` unless ``done`` exists; ``stamp``: write ``done`` after a successful run (for
        commands whose outputs exist before they finish, like fairseq-train's checkpoint_last.pt).

        The command runs in the repository root with this interpreter's scripts first on PATH and
        OMP_NUM_THREADS defaulting to every core; its output is appended to ``log``. Its wall time is added
        to WORK/progress.json under ``key``.

        Raises:
            ReproduceError: the command failed (with the last lines of its log), or did not write ``done``.
        """
        self.step += 1
        prefix = f"[{self.step}/{self.steps}] {key}"
        if done.exists():
            print(f"{prefix}: done already ({done})", flush=True)
            return
        print(f"\n{prefix}: {' '.join(shlex.quote(str(c)) for c in cmd)}\n  log: {log}", flush=True)
        log.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.time()
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        env.setdefault("OMP_NUM_THREADS", str(os.cpu_count() or 1))
        with open(log, "a") as f:
            rc = subprocess.run([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env, cwd=REPO).returncode
        if rc != 0:
            tail = "".join(log.read_text().splitlines(True)[-30:])
            raise ReproduceError(f"{key} failed (exit {rc}); last lines of {log}:\n{tail}\nFix it and re-run: finished steps are skipped.")
        if stamp:
            done.write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))
        if not done.exists():
            raise ReproduceError(f"{key} finished but did not write {done}; see {log}.")
        seconds = time.time() - t0
        self.progress[key] = self.progress.get(key, 0.0) + seconds
        self.progress_path.write_text(json.dumps(self.progress, indent=1))
        print(f"{prefix}: done in {fmt_time(seconds)} (this session {fmt_time(time.time() - self.start)})", flush=True)


# --------------------------------------------------------------------------------------------- commands


def methods_of(run: str, methods: Sequence[str]) -> List[str]:
    """Those of ``methods`` (names from :data:`METHODS` or :data:`PROBES`) that run on ``run``'s checkpoint:
    none unless ``run`` is one of :data:`METHOD_RUNS`; RoPE scaling only on the rotary runs."""
    if run not in METHOD_RUNS:
        return []
    return [m for m in methods if m in PROBES or not METHODS[m][3] or run in ROTARY_RUNS]


def prepare_command(corpus: Path, data: Path) -> List:
    """``lex prepare`` of CORPUS/{train,valid,test}/*.txt into the data-bin ``data``, on every core."""
    return [sys.executable, "-m", "lex_plugin.cli", "prepare", corpus, data, "--workers", os.cpu_count() or 1]


def _fairseq_train(data: Path, save_dir: Path, run_args: List[str], o: dict, break_mode: str, batch_size: int,
                   lr: str, updates: int, warmup: int, log_interval: int, extra: Sequence = ()) -> List:
    """The fairseq-train command every training here shares (Adam (0.9, 0.98), weight decay 0.01, clip 1.0,
    polynomial decay, no validation, ``o``'s model and seed); the rest as given."""
    return [
        "fairseq-train", data, "--user-dir", PLUGIN_DIR, "--task", "language_modeling",
        "--arch", o["arch"], *run_args, "--share-decoder-input-output-embed",
        "--tokens-per-sample", o["train_length"], "--sample-break-mode", break_mode, "--batch-size", batch_size,
        "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--weight-decay", "0.01", "--clip-norm", "1.0",
        "--lr", lr, "--lr-scheduler", "polynomial_decay", "--warmup-updates", warmup,
        "--total-num-update", updates, "--max-update", updates, *extra,
        "--save-dir", save_dir, "--no-epoch-checkpoints", "--disable-validation",
        "--log-format", "simple", "--log-interval", log_interval, "--num-workers", 0, "--seed", o["seed"],
    ]


def train_command(data: Path, save_dir: Path, run_args: List[str], o: dict) -> List:
    """fairseq-train of one run (``run_args``: its ``RUNS`` arguments) at l = ``o["train_length"]`` for
    ``o["max_update"]`` updates into ``save_dir`` (the same budget and optimizer for every run)."""
    updates = o["max_update"]
    return _fairseq_train(data, save_dir, run_args, o, "none", o["batch_size"], o["lr"], updates, max(1, updates // 8), 25,
                          ["--save-interval-updates", max(1, min(100, updates)), "--keep-interval-updates", 1])


def eval_command(data: Path, ckpt: Path, lengths: List[int], windows: List[str], report: Path, o: dict,
                 extra: Sequence = ()) -> List:
    """fairseq-eval-lm of ``ckpt`` over the first ``o["eval_tokens"]`` test tokens at each of ``lengths``
    under each of ``windows`` (``full``, ``sliding``, ``bca``, ``lambda``), writing the length report JSON
    ``report``; ``extra``: further ``--task lex_language_modeling`` arguments (sinks, RoPE scaling)."""
    return [
        "fairseq-eval-lm", data, "--user-dir", PLUGIN_DIR, "--task", "lex_language_modeling",
        "--path", ckpt, "--gen-subset", "test", "--tokens-per-sample", o["train_length"],
        "--sample-break-mode", "none", "--batch-size", 8, "--num-workers", 0,
        "--eval-lengths", ",".join(map(str, lengths)), "--eval-windows", ",".join(windows),
        "--eval-tokens", o["eval_tokens"], "--report-json", report,
        # fairseq's own pass over the whole split at l would cost minutes per model and duplicates the
        # length table's l row: let it see one shard of 1000 (it says how many tokens it evaluated).
        "--num-shards", 1000, "--shard-id", 0, *extra,
    ]


def method_command(data: Path, ckpt: Path, method: str, report: Path, o: dict) -> List:
    """fairseq-eval-lm of ``ckpt`` under one of :data:`METHODS` at every length of ``o["lengths"]`` (the
    same tokens as :func:`eval_command`), writing the length report JSON ``report``.

    Raises:
        KeyError: ``method`` is not in :data:`METHODS`."""
    window, extra, _, _ = METHODS[method]
    return eval_command(data, ckpt, o["lengths"], [window], report, o, extra)


def passkey_data_command(data: Path, ckpt: Path, dest: Path, o: dict) -> List:
    """``lex passkey-data``: :data:`PASSKEY_FINETUNE` ``samples`` prompts with their key, at most l / 2 - 8
    tokens each, filler from the training split of ``data`` (encoded as ``ckpt``'s hub encodes), into ``dest``."""
    return [sys.executable, "-m", "lex_plugin.cli", "passkey-data", data, dest, "--path", ckpt,
            "--samples", PASSKEY_FINETUNE["samples"], "--max-length", o["train_length"] // 2 - 8]


def finetune_command(passkey_data: Path, ckpt: Path, save_dir: Path, run_args: List[str], o: dict) -> List:
    """fairseq-train fine-tuning ``ckpt`` (trained with ``run_args``) on the passkey data-bin, one prompt per
    row at l (:data:`PASSKEY_FINETUNE`: updates, batch, peak lr; polynomial decay, no validation)."""
    f = PASSKEY_FINETUNE
    return _fairseq_train(passkey_data, save_dir, run_args, o, "eos", f["batch_size"], f["lr"], f["updates"],
                          max(1, f["updates"] // 20), 50, ["--finetune-from-model", ckpt])


def passkey_command(data: Path, ckpt: Path, out: Path, o: dict) -> List:
    """``lex passkey`` of ``ckpt`` at l, 2l, 4l and 8l, depths 0.1..0.9, under full attention, BCA, the
    sliding window and Λ-shaped attention, ``o["passkey_trials"]`` prompts per cell (9 distractor keys),
    writing the JSON ``out`` and the heat map beside it (same name, .png)."""
    l = o["train_length"]
    return [sys.executable, "-m", "lex_plugin.cli", "passkey", data, "--path", ckpt,
            "--lengths", ",".join(str(l * k) for k in (1, 2, 4, 8)), "--depths", "0.1,0.3,0.5,0.7,0.9",
            "--windows", "full,bca,sliding,lambda", "--trials", o.get("passkey_trials", 10),
            "--json", out, "--plot", out.with_suffix(".png")]


def resolution_command(data: Path, ckpt: Path, lengths: List[int], window: str, out: Path, o: dict) -> List:
    """``lex resolution`` of ``ckpt`` at ``lengths`` over ``o["resolution_texts"]`` texts, with BCA when
    ``window`` is ``bca`` (else full attention), writing the JSON ``out``."""
    cmd = [sys.executable, "-m", "lex_plugin.cli", "resolution", data, "--path", ckpt,
           "--lengths", ",".join(map(str, lengths)), "--texts", o["resolution_texts"], "--json", out]
    return cmd + (["--bca"] if window == "bca" else [])


# ----------------------------------------------------------------------------------------------- tables


def ppl_table(reports: Dict[str, dict]) -> Dict[str, Dict[str, Dict[int, float]]]:
    """{run: {window: {length: ppl}}} from the eval-lm JSON reports ({run: report}) of the stream protocol;
    window labels lose their size ("bca(128)" -> "bca")."""
    out: Dict[str, Dict[str, Dict[int, float]]] = {}
    for name, report in reports.items():
        for r in report["results"]:
            if r.get("protocol", "stream") == "stream":
                window = r["window"].split("(")[0]  # "bca(128)" -> "bca", "sliding(256)" -> "sliding"
                out.setdefault(name, {}).setdefault(window, {})[int(r["length"])] = float(r["ppl"])
    return out


def _num(value: Optional[float]) -> str:
    if value is None:
        return "-"
    return f"{value:,.0f}" if value >= 1000 else f"{value:.2f}"


def markdown_ppl(ppl, runs: Sequence[str], windows: Sequence[str], lengths: Sequence[int], l: int) -> str:
    """Markdown perplexity table (LeX Tables 2, 4 and 5 in shape) from :func:`ppl_table`'s output.

    Rows: run x window (rows with no numbers left out); columns: each length, then ppl(L_max)/ppl(l).
    """
    top = max(lengths)
    head = "| model | window | " + " | ".join(f"{L} ({L // l}l)" if L >= l else str(L) for L in lengths)
    head += f" | ppl({top // l}l) / ppl(l) |"
    rows = [head, "|---|---|" + "---:|" * (len(lengths) + 1)]
    for name in runs:
        for window in windows:
            row = ppl.get(name, {}).get(window)
            if not row:
                continue
            ratio = row[top] / row[l] if top in row and l in row else None
            rows.append(f"| {LABELS.get(name, name)} | {WINDOW_LABEL[window]} | "
                        + " | ".join(_num(row.get(L)) for L in lengths) + f" | {_num(ratio)} |")
    return "\n".join(rows)


def markdown_methods(ppl, runs: Sequence[str], methods: Sequence[str], lengths: Sequence[int], l: int) -> str:
    """One markdown table per method found in ``ppl``: for each run, the window the method modifies (its
    reference row), then the method, at every length, as :func:`markdown_ppl` writes them.

    Args:
        ppl: {run: {window or method name: {length: ppl}}} (:func:`ppl_table`'s shape).
        runs: row order; methods: names from :data:`METHODS` (a method no run has is left out);
        lengths: columns; l: the training length.
    """
    out = []
    for method in methods:
        have = [n for n in runs if ppl.get(n, {}).get(method)]
        if have:
            out += [f"#### {WINDOW_LABEL[method]}", "", markdown_ppl(ppl, have, [METHODS[method][2], method], lengths, l), ""]
    return "\n".join(out).rstrip()


def markdown_passkey(passkey: Dict[str, dict], runs: Sequence[str], l: int) -> str:
    """Markdown table of passkey accuracy: rows run x window, columns each length (the mean over depths and
    trials), then the mean over lengths beyond l.

    Args:
        passkey: {run: ``lex passkey`` JSON report}.
        runs: row order (runs without a report are left out).
        l: the training length.

    Returns:
        The table, or "" when the reports hold no results.
    """
    rows, lengths = [], sorted({r["length"] for rep in passkey.values() for r in rep["results"]})
    if not lengths:
        return ""
    head = "| model | window | " + " | ".join(f"{L} ({L // l}l)" for L in lengths) + " | beyond l |"
    rows = [head, "|---|---|" + "---:|" * (len(lengths) + 1)]
    for name in runs:
        rep = passkey.get(name)
        if not rep:
            continue
        for window in dict.fromkeys(r["window"] for r in rep["results"]):
            acc = {}
            for r in rep["results"]:
                if r["window"] == window:
                    hit, n = acc.get(r["length"], (0, 0))
                    acc[r["length"]] = (hit + r["retrieved"], n + r["trials"])
            far = [acc[L] for L in lengths if L > l and L in acc]
            beyond = sum(h for h, _ in far) / sum(n for _, n in far) if far else None
            rows.append(f"| {LABELS.get(name, name)} | {window} | "
                        + " | ".join(f"{acc[L][0] / acc[L][1]:.2f}" if L in acc else "-" for L in lengths)
                        + f" | {'-' if beyond is None else f'{beyond:.2f}'} |")
    return "\n".join(rows)


def markdown_resolution(resolution: Dict[str, Dict[str, dict]], runs: Sequence[str], lengths: Sequence[int]) -> str:
    """Markdown table in LeX Table 3's shape: R(s) averaged over layers at each length, without and with BCA.

    Args:
        resolution: {run: {"full" | "bca": ``lex resolution`` JSON report}}.
    """
    head = "| model | " + " | ".join(f"R at {L}, {w}" for L in lengths for w in ("full", "BCA")) + " |"
    rows = [head, "|---|" + "---:|" * (2 * len(lengths))]
    for name in runs:
        res = resolution.get(name)
        if not res:
            continue
        cells = []
        for L in lengths:
            for w in ("full", "bca"):
                r = res.get(w, {}).get("lengths", {}).get(str(L))
                cells.append(f"{r['R']:.4f}" if r else "-")
        rows.append(f"| {LABELS.get(name, name)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def check_claims(ppl, resolution, l: int, lengths: Sequence[int]) -> List[dict]:
    """The issue's four claims, each with its verdict and the numbers it rests on. Nothing is forced: a
    claim that fails is reported as failing.

    Args:
        ppl: :func:`ppl_table`'s output; resolution: as for :func:`markdown_resolution`; l: the training
            length; lengths: the evaluation lengths.

    Returns:
        [{"claim": str, "holds": bool, "numbers": str}], one entry per claim whose numbers are all present
        (a claim with a missing number is left out).
    """
    claims = []

    def get(name, window, L):
        return ppl.get(name, {}).get(window, {}).get(L)

    longer = [L for L in lengths if L > l]
    # 1. LeX + BCA perplexity does not rise from l to the longest length.
    xb = [get("xpos", "bca", L) for L in [l] + longer]
    if all(v is not None for v in xb):
        rises = [(L, v) for L, v in zip(longer, xb[1:]) if v > xb[0]]
        claims.append({"claim": f"LeX + BCA: ppl does not rise from l = {l} to {max(lengths)}",
                       "holds": not rises,
                       "numbers": ", ".join(f"{L}: {_num(v)}" for L, v in zip([l] + longer, xb))})
    # 2. RoPE without BCA blows up past l (taken as: ppl at 2l or beyond more than 2x ppl at l).
    rf = [get("rope", "full", L) for L in [l] + longer]
    if all(v is not None for v in rf):
        worst = max(rf[1:])
        claims.append({"claim": "RoPE with full attention blows up past l (ppl beyond l > 2 x ppl at l)",
                       "holds": worst > 2 * rf[0],
                       "numbers": ", ".join(f"{L}: {_num(v)}" for L, v in zip([l] + longer, rf))})
    # 3. LeX + BCA at or below ALiBi (its own setting: full attention) at 4l and beyond.
    far = [L for L in lengths if L >= 4 * l]
    pairs = [(L, get("xpos", "bca", L), get("alibi", "full", L)) for L in far]
    if far and all(a is not None and b is not None for _, a, b in pairs):
        claims.append({"claim": "LeX + BCA at or below ALiBi (full attention) at 4l and beyond",
                       "holds": all(a <= b for _, a, b in pairs),
                       "numbers": ", ".join(f"{L}: {_num(a)} vs {_num(b)}" for L, a, b in pairs)})
    # 4. Resolution with BCA exceeds resolution without at 2l (xPos).
    res = resolution.get("xpos", {})
    r_full = res.get("full", {}).get("lengths", {}).get(str(2 * l))
    r_bca = res.get("bca", {}).get("lengths", {}).get(str(2 * l))
    if r_full and r_bca:
        claims.append({"claim": f"xPos: resolution with BCA exceeds resolution without at 2l = {2 * l}",
                       "holds": r_bca["R"] > r_full["R"],
                       "numbers": f"BCA {r_bca['R']:.4f} vs full {r_full['R']:.4f}"})
    return claims


def markdown_claims(claims: List[dict]) -> str:
    """Markdown table of :func:`check_claims`' output: claim, holds here? (yes / **no**), numbers."""
    rows = ["| claim | holds here? | numbers |", "|---|---|---|"]
    for c in claims:
        rows.append(f"| {c['claim']} | {'yes' if c['holds'] else '**no**'} | {c['numbers']} |")
    return "\n".join(rows)


def plot_ppl(ppl, runs: Sequence[str], windows: Sequence[str], l: int, out: Path, title: str,
             reference: Optional[Dict[str, str]] = None):
    """Write the PNG ``out``: one panel per window, ppl (log) against length (log2) for every run (the
    paper's Figure 1 in shape), a dotted line at l; ``reference`` ({window: other window}): also draw the
    other window's curve of each run, dashed in the same colour (a method against what it modifies)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    cols = min(3, len(windows))
    rows = -(-len(windows) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 4.2 * rows), sharey=True, squeeze=False)
    plain = FuncFormatter(lambda v, _: f"{v:g}")
    for ax in axes.flat[len(windows):]:
        ax.axis("off")
    for ax, window in zip(axes.flat, windows):
        for name in runs:
            row = ppl.get(name, {}).get(window)
            if row:
                xs = sorted(row)
                line, = ax.plot(xs, [row[x] for x in xs], marker="o", label=LABELS.get(name, name))
                base = ppl.get(name, {}).get((reference or {}).get(window))
                if base:
                    xs = sorted(base)
                    ax.plot(xs, [base[x] for x in xs], linestyle="--", linewidth=1, color=line.get_color(), alpha=0.7)
        ax.axvline(l, color="grey", linestyle=":", linewidth=1)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(plain)
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(plain)
        ax.tick_params(axis="y", which="minor", labelsize=7)
        other = (reference or {}).get(window)
        ax.set_title(WINDOW_LABEL[window] + (f"\n(dashed: {WINDOW_LABEL[other]})" if other else ""), fontsize=10)
        ax.set_xlabel("evaluation length (tokens)")
        ax.grid(alpha=0.3, which="both")
    for row in axes:
        row[0].set_ylabel("test perplexity")
    legend = {}  # every run's line once, whichever panels it appears in
    for ax in axes.flat:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            legend.setdefault(label, handle)
    axes.flat[len(windows) - 1].legend(list(legend.values()), list(legend), fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def write_results(work: Path, o: dict, runs: Sequence[str]) -> str:
    """Collect every finished report under WORK/runs/RUN/ (length_report.json, resolution_{full,bca}.json,
    method_METHOD.json, passkey.json) and WORK/progress.json into WORK/tables.md (Tables 2-5 in shape,
    randomized positions, a table per method, passkey accuracy, the claims, wall time per step),
    WORK/results.json (options, ppl, resolution, passkey, claims, wall seconds) and, once there is a
    perplexity, WORK/ppl_vs_length.png (plus methods_vs_length.png and random_positions_vs_length.png when
    those runs exist).

    Returns:
        The text of tables.md.
    """
    l = o["train_length"]
    reports, resolution, passkey = {}, {}, {}
    for name in runs:
        rdir = work / "runs" / name
        if (rdir / "length_report.json").exists():
            reports[name] = json.loads((rdir / "length_report.json").read_text())
        for w in ("full", "bca"):
            path = rdir / f"resolution_{w}.json"
            if path.exists():
                resolution.setdefault(name, {})[w] = json.loads(path.read_text())
        for probe in PROBES:
            if (rdir / f"{probe}.json").exists():
                passkey.setdefault(probe, {})[name] = json.loads((rdir / f"{probe}.json").read_text())
    ppl = ppl_table(reports)
    for name in runs:  # each method's report holds one window: file it under the method's name
        for method in METHODS:
            path = work / "runs" / name / f"method_{method}.json"
            if path.exists():
                rows = ppl_table({name: json.loads(path.read_text())}).get(name, {})
                ppl.setdefault(name, {})[method] = next(iter(rows.values()), {})
    main = [n for n in runs if RUNS[n][1] == "main"]
    random_pairs = [n for base in ("xpos", "rope", "alibi") for n in (base, f"{base}_random")
                    if n in runs and f"{base}_random" in runs]
    methods = [m for m in METHODS if any(ppl.get(n, {}).get(m) for n in runs)]
    ablations = [n for n in ("xpos", "xpos_no_rotation", "xpos_scalar_zeta", "rope") if n in runs]
    claims = check_claims(ppl, resolution, l, o["lengths"])
    progress = json.loads((work / "progress.json").read_text()) if (work / "progress.json").exists() else {}
    ab_lengths = [l, 8 * l]
    parts = [
        f"Training length l = {l}, {o['arch']}, {o['max_update']} updates x {o['batch_size']} x {l} tokens = "
        f"{o['max_update'] * o['batch_size'] * l:,} training tokens per model; test: first {o['eval_tokens']:,} tokens "
        "of the test split, cut into non-overlapping windows of each length (every token scored once per length).",
        "", "### Table 2 shape: perplexity by length, each window", "",
        markdown_ppl(ppl, main, ["full", "sliding", "bca"], o["lengths"], l),
        "", "### Table 3 shape: attention resolution R(s), mean over layers", "",
        markdown_resolution(resolution, [n for n in runs if n in resolution], [l, 2 * l]),
        "", "### Table 4 shape: xPos ablations at l and 8l", "",
        markdown_ppl(ppl, ablations, ["full", "bca"], ab_lengths, l),
        "", "### Table 5 shape: attention window at 4l and 16l", "",
        markdown_ppl(ppl, main, ["full", "sliding", "bca"], [l, 4 * l, 16 * l], l),
        *(["", "### Randomized positions at training (Ruoss et al. 2023): evaluated with the ordinary positions", "",
            markdown_ppl(ppl, random_pairs, ["full", "sliding", "bca"], o["lengths"], l)] if random_pairs else []),
        *(["", "### Evaluation-time methods on the same checkpoints: perplexity by length", "",
            markdown_methods(ppl, runs, methods, o["lengths"], l)] if methods else []),
        *(["", "### Passkey retrieval: accuracy (mean over depths 0.1..0.9; chance 0.10)", "",
            markdown_passkey(passkey["passkey"], runs, l)] if "passkey" in passkey else []),
        *(["", f"### Passkey retrieval after fine-tuning on the probe's format ({PASSKEY_FINETUNE['updates']} updates "
            f"x {PASSKEY_FINETUNE['batch_size']} prompts of at most {l // 2 - 8} tokens)", "",
            markdown_passkey(passkey["passkey_finetuned"], runs, l)] if "passkey_finetuned" in passkey else []),
        "", "### Claims", "", markdown_claims(claims),
        "", "### Wall time per step", "", "| step | wall time |", "|---|---:|",
        *[f"| {k} | {fmt_time(v)} |" for k, v in progress.items()],
        f"| **total** | **{fmt_time(sum(progress.values()))}** |",
    ]
    text = "\n".join(parts) + "\n"
    (work / "tables.md").write_text(text)
    (work / "results.json").write_text(json.dumps(
        {"options": o, "ppl": {n: {w: {str(L): v for L, v in row.items()} for w, row in d.items()} for n, d in ppl.items()},
         "resolution": {n: {w: {L: r["R"] for L, r in d["lengths"].items()} for w, d in res.items()} for n, res in resolution.items()},
         **{probe: {n: rep["results"] for n, rep in reports.items()} for probe, reports in passkey.items()},
         "claims": claims, "wall_seconds": progress}, indent=1))
    if ppl:
        plot_ppl(ppl, main, ["full", "sliding", "bca"], l, work / "ppl_vs_length.png",
                 f"{o['arch']}, l = {l}, {o['max_update'] * o['batch_size'] * l / 1e6:.2f}M training tokens: test ppl vs length")
    if methods:
        plot_ppl(ppl, [n for n in runs if n in METHOD_RUNS], methods, l, work / "methods_vs_length.png",
                 f"evaluation-time methods on the same checkpoints (l = {l})", {m: METHODS[m][2] for m in methods})
    if random_pairs:
        plot_ppl(ppl, random_pairs, ["full", "sliding", "bca"], l, work / "random_positions_vs_length.png",
                 f"trained with and without randomized positions (L_max = {max(o['lengths'])}, l = {l})")
    return text


# ------------------------------------------------------------------------------------------------- runs


def check_options(work: Path, o: dict) -> None:
    """Record ``o`` in WORK/options.json (creating WORK), after checking that a run already there used the
    same options (``methods`` may differ: each method's report stands alone).

    Raises:
        ReproduceError: WORK/options.json holds other options (mixing budgets would make the tables unequal).
    """
    work.mkdir(parents=True, exist_ok=True)
    saved = work / "options.json"
    if saved.exists():
        before = json.loads(saved.read_text())
        # which methods run does not change the numbers of the others; an option a run directory predates is recorded
        changed = {k: (before[k], v) for k, v in o.items() if k != "methods" and k in before and before[k] != v}
        if changed:
            raise ReproduceError(f"{work} holds a run with other options {changed}: use another --work "
                                 "or remove it; mixing budgets would make the tables unequal.")
    saved.write_text(json.dumps(o, indent=1))


def reproduce(work: Path, o: dict, runs: Sequence[str], corpus: Path, data_bin: Optional[Path] = None) -> str:
    """Every step of the reproduction, skipping the finished ones: check and record the options
    (:func:`check_options`), prepare the data-bin from ``corpus`` unless it exists, then per run train,
    evaluate (main and random-position runs at every length under full / sliding / BCA; ablations at l and
    8l under full / BCA), measure resolution at l and 2l under full attention and BCA, and on the
    :data:`METHOD_RUNS` checkpoints run ``o["methods"]`` (RoPE scaling on rotary schemes only), rewriting the results
    (:func:`write_results`) after each run. Prints each step, then the tables and where they are.

    Args:
        work: the work directory (WORK/runs/RUN/ holds each run's checkpoints, logs and reports).
        o: the options (see the module docstring), already validated.
        runs: names from :data:`RUNS`, in order.
        corpus: CORPUS/{train,valid,test}/*.txt, prepared only when the data-bin has no dict.txt.
        data_bin: the data-bin (default WORK/data-bin).

    Returns:
        The text of WORK/tables.md.

    Raises:
        ReproduceError: other options in WORK, or a step failed (re-running continues after the last
            finished step).
    """
    check_options(work, o)
    l, lengths = o["train_length"], o["lengths"]
    data = data_bin or work / "data-bin"
    ab_lengths = sorted({l, 8 * l} & set(lengths)) or [l]

    passkey_bin = work / "passkey-bin"
    run_methods = {n: methods_of(n, o.get("methods", [])) for n in runs}
    tuned_runs = [n for n in runs if "passkey_finetuned" in run_methods[n]]
    steps = ((0 if (data / "dict.txt").exists() else 1) + sum(4 + len(run_methods[n]) for n in runs)
             + len(tuned_runs) + (1 if tuned_runs and not (passkey_bin / "train.idx").exists() else 0))
    run = Runner(work, steps)
    if not (data / "dict.txt").exists():
        run("prepare", prepare_command(corpus, data), work / "prepare.log", data / "dict.txt")
    for name in runs:
        run_args, role = RUNS[name]
        if role == "random":
            run_args = [*run_args, "--random-positions", max(lengths)]
        rdir = work / "runs" / name
        ckpt_dir = rdir / "checkpoints"
        run(f"train {name}", train_command(data, ckpt_dir, run_args, o), rdir / "train.log", rdir / "train.done", stamp=True)
        ckpt = ckpt_dir / "checkpoint_last.pt"
        windows = ["full", "bca"] if role == "ablation" else ["full", "sliding", "bca"]
        run(f"eval {name}", eval_command(data, ckpt, ab_lengths if role == "ablation" else lengths, windows,
                                         rdir / "length_report.json", o), rdir / "eval.log", rdir / "length_report.json")
        for w in ("full", "bca"):
            out = rdir / f"resolution_{w}.json"
            run(f"resolution {name} {w}", resolution_command(data, ckpt, [l, 2 * l], w, out, o), rdir / f"resolution_{w}.log", out)
        for method in run_methods[name]:
            if method == "passkey":
                out = rdir / "passkey.json"
                run(f"passkey {name}", passkey_command(data, ckpt, out, o), rdir / "passkey.log", out)
            elif method == "passkey_finetuned":
                tuned = rdir / "passkey_ft"
                if not (passkey_bin / "train.idx").exists():
                    run("passkey data", passkey_data_command(data, ckpt, passkey_bin, o), work / "passkey-data.log",
                        passkey_bin / "train.idx")
                run(f"finetune {name}", finetune_command(passkey_bin, ckpt, tuned, run_args, o), tuned / "train.log",
                    tuned / "train.done", stamp=True)
                out = rdir / "passkey_finetuned.json"
                run(f"passkey_finetuned {name}", passkey_command(data, tuned / "checkpoint_last.pt", out, o),
                    rdir / "passkey_finetuned.log", out)
            else:
                out = rdir / f"method_{method}.json"
                run(f"{method} {name}", method_command(data, ckpt, method, out, o), rdir / f"method_{method}.log", out)
        write_results(work, o, runs)  # tables grow as runs finish
    text = write_results(work, o, runs)
    print("\n" + text)
    print(f"tables: {work / 'tables.md'}; plot: {work / 'ppl_vs_length.png'}; all numbers: {work / 'results.json'}")
    return text
