"""The harness of the benchmark scripts (``scripts/bench_*.py``): memory of this process, one measurement in
a fresh process, timing, markdown tables, and the comparison with a baseline checkout.

A script measures one point with ``SCRIPT --one ARGS...`` in a fresh Python process (so the peak memory is
that point's alone), which prints its result as JSON on its last stdout line (:func:`emit`); the parent
collects them with :func:`run_isolated`. With a baseline checkout (an older version of this repository
whose scripts take the same ``--one`` arguments), :func:`measure` runs every point twice, this checkout's
script then the baseline's ``BASELINE/scripts/SCRIPT`` under ``PYTHONPATH=BASELINE``, so drift on a shared
machine hits both; :func:`result_header` and :func:`result_cells` give the table old / new / new/old columns.
"""

import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Optional, Sequence, Tuple

__all__ = [
    "BENCH_VOCAB_SYMBOLS", "Column", "baseline_script", "bench_model", "best_time", "check_baseline", "checkout_env",
    "design_of", "emit",
    "markdown_table", "measure", "median_time", "random_model",
    "peak_rss_mb", "ratio", "result_cells", "result_header", "rss_mb", "run_isolated", "sweep", "sweep_table", "thread_count",
    "time_calls", "write_report",
]

# A table column of a result dict: (header label, key in the result, format of the value).
Column = Tuple[str, str, str]

BENCH_VOCAB_SYMBOLS = 8188  # the benchmarks' random models: a dictionary of 8192 entries with fairseq's 4 special symbols
BENCH_SINK_TOKENS = 4  # the bca_sinks mode's sinks


def rss_mb() -> float:
    """This process's resident memory now, in MiB (Linux ``/proc/self/statm``)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """This process's peak resident memory since it started, in MiB (``ru_maxrss``, KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def thread_count() -> int:
    """The intra-op threads a measurement uses: ``OMP_NUM_THREADS``, else every core."""
    return int(os.environ.get("OMP_NUM_THREADS", os.cpu_count() or 1))


def time_calls(fn: Callable, args: Iterable) -> List[float]:
    """Wall seconds of ``fn(a)`` for each ``a`` of ``args``, in order."""
    times = []
    for a in args:
        start = time.perf_counter()
        fn(a)
        times.append(time.perf_counter() - start)
    return times


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """The shortest wall time in seconds of ``repeats`` (>= 1) calls of ``fn()``."""
    return min(time_calls(lambda _: fn(), range(max(1, repeats))))


BASE_OPTIONS = ("pos_emb", "decoder_layers")  # what a design's base model keeps of its options (``@base:RUN``)


def design_of(mode: str, training_length: int) -> Tuple[str, dict]:
    """A bench mode with an optional trained design (``full@rnope_swa``: a run of ``scripts/reproduce.py``, its
    layer pattern's windows at ``training_length``; ``full@base:gemma_5to1``: that run's base model, its --pos-emb
    and depth without its design, the cost a design is compared with; a DroPE run with ``drope_start=1``, which
    :func:`random_model` turns into its positions dropped, as it evaluates): (the mode, the model options of that run
    as ``build_random_lm`` keywords: ``{"pos_emb": "rope", "layer_pattern": ...}``; {} without one).

    Raises:
        ValueError: a name that is not a run of the reproduction.
    """
    from .reproduce.catalogue import RUNS, run_arguments

    base, at, design = mode.partition("@")
    if not at:
        return mode, {}
    kept, run = (BASE_OPTIONS, design[len("base:"):]) if design.startswith("base:") else (None, design)
    if run not in RUNS:
        raise ValueError(f"mode {mode!r}: {run!r} is not a run of scripts/reproduce.py ({', '.join(RUNS)}).")
    args, options = [str(a) for a in run_arguments(run, training_length)], {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            value = args[i + 1] if i + 1 < len(args) and not args[i + 1].startswith("--") else True
            options[arg[2:].replace("-", "_")] = int(value) if isinstance(value, str) and value.isdigit() else value
    if kept is not None:
        return base, {k: v for k, v in options.items() if k in kept}
    if RUNS[run][1] == "drope":  # evaluated as trained: its positions dropped (random_model's updates reach the start)
        options["drope_start"] = 1
    return base, options


def bench_model(label: str, arch: str, training_length: int, pos_emb: Optional[str] = None):
    """The random model a benchmark mode names, ready to time: ``label`` is a mode (``full``, ``bca``, ``sliding``,
    ``lm_infinite``, a position map; ``bca_sinks``: BCA with :data:`BENCH_SINK_TOKENS` sinks; ``bca_blockwise`` /
    ``sliding_blockwise`` / ``reference``: BCA, the sliding window, full attention, which the caller runs block by block
    or through TorchScale's reference attention), with ``@RUN`` for a reproduction run's design (:func:`design_of`) and
    ``+bf16`` for bf16 autocast (:func:`precision_of`); ``pos_emb``: the scheme where the design sets none.

    Returns:
        (model under the mode's attention spec and precision, its fairseq dictionary of
        :data:`BENCH_VOCAB_SYMBOLS` + 4 entries, the mode without design or precision, the ``AttentionSpec``).

    Raises:
        ValueError: as :func:`design_of`, :func:`precision_of` and ``AttentionOptions``.
    """
    from ..modules.attention import AttentionOptions

    mode, design = design_of(label, training_length)
    mode, autocast = precision_of(mode)
    model, d = random_model(arch, {**({"pos_emb": pos_emb} if pos_emb else {}), **design}, BENCH_VOCAB_SYMBOLS, training_length)
    base = {"bca_blockwise": "bca", "sliding_blockwise": "sliding", "reference": "full"}.get(mode, mode)
    options = AttentionOptions("bca", sink_tokens=BENCH_SINK_TOKENS) if base == "bca_sinks" else AttentionOptions(base)
    spec = options.spec(training_length)
    return model.under(spec).with_autocast(autocast), d, mode, spec


def random_model(arch: str, design: dict, vocab_size: int, training_length: int):
    """A ``build_random_lm`` model of a bench mode's design (:func:`design_of`; shared input and output embeddings), as
    a trained run of it evaluates: a DroPE run (``drope_start``) told that many updates are done, so that it runs with
    its positions dropped. Returns (model, dictionary)."""
    from ..models.builder import build_random_lm

    model, d = build_random_lm(arch, vocab_size=vocab_size, tokens_per_sample=training_length,
                               share_decoder_input_output_embed=True, **design)
    if design.get("drope_start"):
        model.set_num_updates(design["drope_start"])
    return model, d


def precision_of(mode: str) -> Tuple[str, Optional[object]]:
    """A bench mode with an optional precision suffix (``bca+bf16``): (the mode, the autocast ``torch.dtype`` or None).

    Raises:
        ValueError: a suffix other than ``+bf16``.
    """
    import torch

    base, plus, precision = mode.partition("+")
    if plus and precision != "bf16":
        raise ValueError(f"mode {mode!r}: the only precision suffix is +bf16 (bf16 autocast over fp32 weights).")
    return base, torch.bfloat16 if plus else None


def median_time(fn: Callable, args: Iterable) -> float:
    """The median wall time in seconds of ``fn(a)`` over ``args`` (at least one)."""
    return statistics.median(time_calls(fn, args))


def emit(result: dict) -> None:
    """Print ``result`` as the JSON line :func:`run_isolated` reads (the last line of stdout)."""
    print(json.dumps(result), flush=True)


def baseline_script(checkout: Path, script: Path) -> Path:
    """``CHECKOUT/scripts/<name of script>``, the baseline's version of a bench script.

    Raises:
        FileNotFoundError: the checkout has no such script.
    """
    path = Path(checkout) / "scripts" / Path(script).name
    if not path.is_file():
        raise FileNotFoundError(f"baseline checkout {checkout} has no {path.relative_to(checkout)}")
    return path


def check_baseline(parser, checkout: Optional[Path], script: Path) -> None:
    """Stop a bench script through ``parser.error`` (argparse's usage error) when ``--baseline CHECKOUT`` holds no
    version of ``script``; nothing without ``--baseline``."""
    if checkout is not None:
        try:
            baseline_script(checkout, script)
        except FileNotFoundError as e:
            parser.error(str(e))


def write_report(path, rows: List[dict], started: float, cuda: Optional[bool] = None) -> None:
    """A benchmark's ``--json-out`` report at ``path``: ``{"provenance": ..., "rows": rows}``, the provenance (command,
    commit, device, versions) with the wall time since ``started`` (a ``time.perf_counter()`` value); ``cuda``: whether
    the rows ran on a GPU (None: whether this process sees one)."""
    from ..provenance import provenance

    report = {"provenance": provenance(wall_s=time.perf_counter() - started, cuda=cuda), "rows": rows}
    Path(path).write_text(json.dumps(report, indent=2) + "\n")


def checkout_env(checkout: Optional[Path]) -> Dict[str, str]:
    """The environment of a process that must import ``lex_plugin`` from ``checkout``: this one's, with
    ``checkout`` first on PYTHONPATH and this interpreter's scripts first on PATH; ``checkout`` None: this
    process's environment with only PATH changed."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if checkout is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(Path(checkout).resolve()), os.environ.get("PYTHONPATH")) if p)
    return env


def run_isolated(script: Path, args: Sequence, checkout: Optional[Path] = None) -> dict:
    """Run ``script --one ARGS...`` in a fresh Python process (a clean peak memory) and return the JSON of
    its last stdout line.

    Args:
        script: the bench script (this checkout's).
        args: the arguments after ``--one`` (converted with ``str``).
        checkout: a baseline checkout: run ``CHECKOUT/scripts/<script's name>`` instead, under
            ``PYTHONPATH=CHECKOUT`` (see :func:`checkout_env`).

    Returns:
        The measurement, or ``{"skipped": reason}`` when the process failed or printed no JSON.
    """
    path = Path(script) if checkout is None else baseline_script(checkout, script)
    proc = subprocess.run([sys.executable, str(path), "--one", *map(str, args)], capture_output=True, text=True,
                          env=checkout_env(checkout))
    if proc.returncode != 0:
        return {"skipped": f"failed: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}"}
    lines = proc.stdout.strip().splitlines()
    try:
        return json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"skipped": "failed: no JSON result on the last line of its output"}


def measure(script: Path, args: Sequence, baseline: Optional[Path] = None) -> Tuple[dict, Optional[dict]]:
    """One point measured with :func:`run_isolated`: this checkout's script, then (with ``baseline``) the
    baseline checkout's on the same arguments.

    Returns:
        (new, old): the two results; old is None without a baseline.
    """
    new = run_isolated(script, args)
    return new, (run_isolated(script, args, checkout=baseline) if baseline is not None else None)


def ratio(new: Optional[float], old: Optional[float]) -> str:
    """``new / old`` to two decimals, "-" when either is missing or not positive (a memory delta of 0 or
    below says nothing as a ratio)."""
    if new is None or old is None or new <= 0 or old <= 0:
        return "-"
    return f"{new / old:.2f}"


def _shown(value: float, fmt: str) -> float:
    """``value`` rounded as the table shows it (``fmt``), so that ratios of numbers below the table's
    resolution read "-" instead of noise."""
    return float(fmt.format(value).replace(",", ""))


def result_header(columns: Sequence[Column], baseline: bool) -> List[str]:
    """Header labels of ``columns``; with ``baseline``, three per column: ``LABEL old``, ``LABEL new``,
    ``LABEL new/old``."""
    if not baseline:
        return [label for label, _, _ in columns]
    return [f"{label} {part}" for label, _, _ in columns for part in ("old", "new", "new/old")]


def _cells(result: dict, columns: Sequence[Column]) -> List[str]:
    if "skipped" in result:
        return ["-"] * (len(columns) - 1) + [result["skipped"]]
    return [fmt.format(result[key]) for _, key, fmt in columns]


def result_cells(new: dict, old: Optional[dict], columns: Sequence[Column], baseline: bool) -> List[str]:
    """The cells of one result under :func:`result_header`'s labels.

    Args:
        new, old: this checkout's and the baseline's result dicts (old ignored without ``baseline``). A
            ``{"skipped": reason}`` result shows "-" in its cells but the last, which holds the reason.
        columns: (label, key, format) per value, e.g. ``("full tok/s", "tokens_per_s", "{:,.0f}")``.
        baseline: three cells per column (old, new, new/old) instead of one. The ratio is that of the
            values as shown (rounded by the column's format); see :func:`ratio`.
    """
    new_cells = _cells(new, columns)
    if not baseline:
        return new_cells
    old = old if old is not None else {"skipped": "not measured"}
    old_cells = _cells(old, columns)
    out = []
    for i, (_, key, fmt) in enumerate(columns):
        both = "skipped" not in new and "skipped" not in old
        r = ratio(_shown(new[key], fmt), _shown(old[key], fmt)) if both else "-"
        out += [old_cells[i], new_cells[i], r]
    return out


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A markdown table: ``| a | b |``, ``|---|---|``, then one line per row."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def sweep(script: Path, points: Sequence[Tuple[str, int]], args: Sequence, baseline: Optional[Path],
          describe: Callable[[dict], str], skip: Optional[Callable[[str, int], Optional[str]]] = None,
          size_key: str = "length") -> List[dict]:
    """Measure every (mode, size) point: ``script --one MODE SIZE ARGS...`` in a fresh process, then the
    baseline's script on the same arguments (:func:`measure`), printing ``describe(result)`` per measurement
    to stderr as it goes.

    Args:
        skip: ``skip(mode, size)`` -> a reason not to run the point (recorded as ``{"skipped": reason}``) or None.
        size_key: the key of the size in the rows (``length``, ``context``).

    Returns:
        One row per point: this checkout's result, with the baseline's under ``"baseline"`` when there is one.
    """
    rows = []
    for mode, size in points:
        reason = skip(mode, size) if skip is not None else None
        if reason is not None:
            skipped = {"mode": mode, size_key: size, "skipped": reason}
            rows.append(dict(skipped, baseline=skipped) if baseline is not None else skipped)
            print(f"{mode:>17} {size_key}={size:>6}: skipped ({reason})", file=sys.stderr)
            continue
        new, old = measure(script, [mode, size, *args], baseline)
        rows.append(new if old is None else dict(new, baseline=old))
        for tag, r in (("", new), (" (baseline)", old)):
            if r is not None:
                print(f"{mode:>17} {size_key}={size:>6}: " + ("skipped: " + r["skipped"] if "skipped" in r else describe(r)) + tag,
                      file=sys.stderr)
    return rows


def sweep_table(rows: Sequence[dict], sizes: Sequence[int], modes: Sequence[str], columns: Dict[str, Sequence[Column]],
                baseline: bool, size_key: str = "length", size_label: str = "L", size_format: str = "{}") -> str:
    """The markdown table of a :func:`sweep`: one row per size, each mode's ``columns`` side by side (old /
    new / new/old with ``baseline``)."""
    header = [size_label] + [h for m in modes for h in result_header(columns[m], baseline)]
    table = []
    for size in sizes:
        cells = [size_format.format(size)]
        for m in modes:
            r = next(r for r in rows if r["mode"] == m and r[size_key] == size)
            cells += result_cells(r, r.get("baseline"), columns[m], baseline)
        table.append(cells)
    return markdown_table(header, table)
