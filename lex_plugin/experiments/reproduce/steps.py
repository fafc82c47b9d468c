"""The reproduction's steps: per run train and evaluate, the methods and probes on its checkpoints, a DroPE run's
recalibration (each step resumable through :class:`~.runner.Runner`), and :func:`reproduce`, which runs them all."""

import json
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import List, Optional, Sequence, Tuple

from ...modules.attention.flags import ATTENTION_FLAGS
from ...modules.layer_pattern import parse_layer_pattern
from .catalogue import (BABILONG_DATA_DONE, BABILONG_FINETUNE, BABILONG_REPORT, BABILONG_TUNED, CHOOSES_KEYS, DROPE_TEMPERATURES,
                        LONGPPL_COMMON_REPORT, LONGPPL_KEY_TOKENS, LONGPPL_REPORT, PROBES, RECALIBRATED, RULER_DATA_DONE, RULER_FINETUNE, RULER_REPORT, RULER_TUNED, RUNS,
                        SCALED_PASSKEY, drope_start, full_attention_only, is_design, methods_of, run_arguments)
from .commands import (answer_finetune_command, babilong_command, babilong_data_command, eval_command, finetune_command,
                       longppl_command, longppl_windows, method_command, passkey_command, passkey_data_command, prepare_command, probe_windows,
                       resolution_command, ruler_command, ruler_data_command, scaled_passkey_flags, train_command)
from .options import ReproduceOptions
from .results import write_results
from .runner import ReproduceError, Runner, check_options


def _updates_in(ckpt: Path) -> int:
    """The updates a fairseq checkpoint holds (0 when there is none yet)."""
    if not ckpt.exists():
        return 0
    import torch

    return int(torch.load(ckpt, map_location="cpu", weights_only=False)["optimizer_history"][-1]["num_updates"])


def _train_to(run: Runner, key: str, cmd: list, log: Path, stamp: Path, ckpt: Path, updates: int,
              snapshot: Optional[Path] = None) -> None:
    """Train until ``ckpt`` holds exactly ``updates`` updates, then stamp (and first copy it to ``snapshot``).

    fairseq-train resumed at its --max-update still takes one step before it checks, so a checkpoint already at
    ``updates`` (a kill after fairseq saved, before the stamp) is stamped without running it.

    Raises:
        ReproduceError: ``ckpt`` is already past ``updates`` (a snapshot is taken on the way, never after), or
            the finished run does not hold ``updates``.
    """
    def keep() -> None:
        held = _updates_in(ckpt)
        if held != updates:
            raise ReproduceError(f"{ckpt} holds {held} updates after training to {updates}; see {log}.")
        if snapshot is not None:
            shutil.copy2(ckpt, snapshot)

    if not stamp.exists():
        held = _updates_in(ckpt)
        if held > updates:
            raise ReproduceError(f"{ckpt} has trained {held} updates, past {updates}: a snapshot is taken on the way, "
                                 f"not after. Use another --work, or leave out the budgets up to {held}.")
        if held == updates:
            keep()
            stamp.write_text(time.strftime("%Y-%m-%d %H:%M:%S\n"))
    run(key, cmd, log, stamp, stamp=True, then=keep)


@dataclass(frozen=True)
class _Run:
    """One run of a reproduction as its steps see it: the name, the training flags, where its files go."""

    name: str
    args: tuple  # --pos-emb and the other training flags (RUNS, with --random-positions for the random runs)
    role: str  # "main", "ablation", "random", "design" or "drope" (catalogue.RUNS)
    dir: Path  # WORK/runs/NAME
    rotary: bool  # a rotary scheme (RoPE scalings and Leaky ReRoPE apply)
    position_maps: bool = True  # a global layer has positions to remap (not a pattern whose global layers are NoPE)

    @property
    def ckpt(self) -> Path:
        return self.dir / "checkpoints" / "checkpoint_last.pt"

    @property
    def sink_token(self) -> bool:
        """Trained with a sink token (``--sink-token``)."""
        return _has_sink_token(self.args)

    def window_flags(self, windows: Sequence[str]) -> tuple:
        """The evaluation flags of this run under the attention modes ``windows``: ``--sink-tokens 1`` for a run
        trained with a sink token when one of them takes sinks (BCA, the sliding window: ``ATTENTION_FLAGS``' owners),
        so that those windows keep it visible as it was in training (StreamingLLM section 3.3); none otherwise
        (full attention sees the sink token as any first token, and the lex commands refuse ``--sink-tokens`` where
        no mode takes it)."""
        takes = set(windows) & set(ATTENTION_FLAGS["sink_tokens"].owners)
        return ("--sink-tokens", 1) if self.sink_token and takes else ()

    def longppl_windows(self, o: ReproduceOptions) -> tuple:
        """The attention modes this run's LongPPL is measured under: :func:`~.commands.longppl_windows`, without the
        sliding window of l for a run whose global layers choose their own keys (:func:`full_attention_only`)."""
        return longppl_windows(self.rotary, self.position_maps, o, baseline=not full_attention_only(self.args))

    def probe_flags(self, o: ReproduceOptions) -> tuple:
        """:meth:`window_flags` under the probes' modes (:func:`probe_windows`, limited by ``o.probe_windows``)."""
        return self.window_flags(probe_windows(self.rotary, self.position_maps, o.probe_windows))


def _has_sink_token(run_args) -> bool:
    """Whether a run's training flags place a sink token (``--sink-token``): ``--sink-tokens 1`` under its bounded
    windows."""
    return "--sink-token" in map(str, run_args)


def _resolution_refused(run_args) -> bool:
    """Whether the resolution analysis refuses a run's checkpoint (``analysis.resolution``): a sink token ahead of the
    text, differential attention's two maps per head, or keys chosen per head and query (:data:`CHOOSES_KEYS`)."""
    return _has_sink_token(run_args) or bool(({"--differential-attention"} | CHOOSES_KEYS) & set(map(str, run_args)))


def _has_positions(run_args, pos_emb: str, training_length: int) -> bool:
    """Whether a global layer of the run has positions a position map could remap: every run but a layer pattern
    whose global layers are NoPE (``--layer-pattern``)."""
    if "--layer-pattern" not in run_args:
        return True
    kinds = parse_layer_pattern(str(run_args[run_args.index("--layer-pattern") + 1]), pos_emb, None, training_length)
    return any(k.is_global and k.positions for k in kinds)


def _passkey_at_16l(role: str, probe_windows: Sequence[str]) -> bool:
    """Whether a run's fine-tuned passkey is also probed at 16l (the verdict's greedy column): a trained design's
    (under full attention), and another run's where ``--probe-windows`` names windows (a reference method's battery,
    under them)."""
    return is_design(role) or bool(probe_windows)


def _steps_of(method: str, at_16l: bool = False) -> int:
    """The runner steps of one method on one run: a probe after fine-tuning is the fine-tuning and its probes (the
    passkey also at 16l where ``at_16l``, :func:`_passkey_at_16l`)."""
    if method in ("ruler", "babilong"):
        return 2
    if method == "passkey_finetuned_scaled":
        return 1 + len(SCALED_PASSKEY)
    if method == "passkey_finetuned":
        return 3 if at_16l else 2
    return 2 if method.startswith("passkey_finetuned") else 1


def _recalibration_steps(methods: Sequence[str], extra_seeds: int = 0) -> int:
    """The runner steps of a DroPE run's recalibration (:func:`_recalibrate`) with the probes ``methods``: one valid
    evaluation per C of the grid, the length evaluation, and each probe the verdict reads again (the passkey twice),
    the fine-tuned probes once per fine-tuning seed (the run's and ``extra_seeds`` more)."""
    seeds = 1 + extra_seeds
    return (len(DROPE_TEMPERATURES) + 1 + (2 * seeds if "passkey_finetuned" in methods else 0) + seeds * ("ruler" in methods)
            + ("longppl" in methods) + ("longppl_common" in methods))


def _step_count(work: Path, data: Path, runs: Sequence[str], run_methods: dict, budgets: Sequence[int],
                extra_seeds: int = 0, probe_windows: Sequence[str] = ()) -> int:
    """The number of steps :func:`reproduce` will announce: per run training, evaluation and resolution (4; 2 with a
    sink token), two per budget, its methods' steps, a DroPE run's recalibration; the data-bin and each probe's data
    once, unless already written; ``extra_seeds`` more fine-tunings of each fine-tuned probe (passkey, RULER-lite,
    BABILong-lite) per run that takes it (``probe_windows``: ``--probe-windows``, which decides the passkey's 16l step)."""
    tuned = any(m.startswith("passkey_finetuned") for n in runs for m in run_methods[n])
    uses = lambda probe: any(probe in run_methods[n] for n in runs)  # noqa: E731
    return ((0 if (data / "dict.txt").exists() else 1)
            + sum(2 + (0 if _resolution_refused(RUNS[n][0]) else 2) + 2 * len(budgets)
                  + sum(_steps_of(m, _passkey_at_16l(RUNS[n][1], probe_windows)) for m in run_methods[n])
                  + extra_seeds * sum(_steps_of(m, _passkey_at_16l(RUNS[n][1], probe_windows)) for m in run_methods[n]
                                      if m in ("passkey_finetuned", "ruler", "babilong"))
                  + (_recalibration_steps(run_methods[n], extra_seeds) if RUNS[n][1] == "drope" else 0) for n in runs)
            + (1 if tuned and not (work / "passkey-bin" / "train.idx").exists() else 0)
            + (1 if uses("ruler") and not (work / "ruler-bin" / RULER_DATA_DONE).exists() else 0)
            + (1 if uses("babilong") and not (work / "babilong-bin" / BABILONG_DATA_DONE).exists() else 0))


def _train_and_evaluate(run: Runner, r: _Run, data: Path, o: ReproduceOptions, budgets: Sequence[int]) -> None:
    """Train ``r`` (a snapshot at each budget, each evaluated as the last checkpoint is), evaluate the last
    checkpoint at every length (ablations: l and 8l) under full / sliding / BCA (ablations: full / BCA; MoBA runs: full),
    and measure attention resolution at l and 2l under full attention and BCA (not for a run the analysis refuses)."""
    l, lengths = o.training_length, o.lengths
    ckpt_dir, ckpt = r.ckpt.parent, r.ckpt
    windows = ["full", "bca"] if r.role == "ablation" else ["full", "sliding", "bca"]
    if full_attention_only(r.args):  # (MoBA's layers choose their own blocks)
        windows = ["full"]
    run_lengths = (sorted({l, 8 * l} & set(lengths)) or [l]) if r.role == "ablation" else lengths
    for budget in budgets:
        snap = ckpt_dir / f"checkpoint_u{budget}.pt"
        _train_to(run, f"train {r.name} to {budget}", train_command(data, ckpt_dir, list(r.args), o, updates=budget),
                  r.dir / "train.log", r.dir / f"train_u{budget}.done", ckpt, budget, snap)
        report = r.dir / f"length_report_u{budget}.json"
        run(f"eval {r.name} at {budget} updates", eval_command(data, snap, run_lengths, windows, report, o, r.window_flags(windows)),
            r.dir / f"eval_u{budget}.log", report)
    _train_to(run, f"train {r.name}", train_command(data, ckpt_dir, list(r.args), o), r.dir / "train.log",
              r.dir / "train.done", ckpt, o.max_update)
    run(f"eval {r.name}", eval_command(data, ckpt, run_lengths, windows, r.dir / "length_report.json", o, r.window_flags(windows)),
        r.dir / "eval.log", r.dir / "length_report.json")
    if _resolution_refused(r.args):  # (analysis.resolution refuses the checkpoint)
        return
    for w in ("full", "bca"):
        out = r.dir / f"resolution_{w}.json"
        run(f"resolution {r.name} {w}", resolution_command(data, ckpt, [l, 2 * l], w, out, o), r.dir / f"resolution_{w}.log", out)


def _fine_tuning_seeds(o: ReproduceOptions) -> List[Tuple[int, str]]:
    """Each fine-tuning seed of the probes and the suffix of its files' names: the run's seed first (no suffix), then
    each of ``o.extra_seeds`` (``_seedN``)."""
    return [(o.seed, "")] + [(s, f"_seed{s}") for s in o.extra_seeds]


def _passkey_finetuned(run: Runner, r: _Run, method: str, work: Path, data: Path, o: ReproduceOptions) -> None:
    """The passkey probe after fine-tuning on its format (the probe's data-bin written once): at l..8l
    (``passkey_finetuned``, ``_logn`` with log-n; a trained design's also at 16l under full attention, and another
    run's at 16l under the windows ``--probe-windows`` names where it names some: ``passkey_finetuned_16l.json``), or
    at 8l under each RoPE scaling (``passkey_finetuned_scaled``); the passkey probe again after a fine-tuning under
    each of ``o.extra_seeds`` (``passkey_ft_seedN/``, ``passkey_finetuned_seedN.json``,
    ``passkey_finetuned_16l_seedN.json``)."""
    l, passkey_bin, tuned = o.training_length, work / "passkey-bin", r.dir / "passkey_ft" / "checkpoint_last.pt"
    if not (passkey_bin / "train.idx").exists():
        run("passkey data", passkey_data_command(data, r.ckpt, passkey_bin, o), work / "passkey-data.log",
            passkey_bin / "train.idx")
    run(f"finetune {r.name}", finetune_command(passkey_bin, r.ckpt, tuned.parent, list(r.args), o), tuned.parent / "train.log",
        tuned.parent / "train.done", stamp=True)
    if method == "passkey_finetuned_scaled":  # 8l only, each scaling with and without log-n
        for scaled in SCALED_PASSKEY:
            out = r.dir / f"passkey_finetuned_{scaled}.json"
            run(f"passkey_finetuned {r.name} {scaled}",
                passkey_command(data, tuned, out, o, extra=scaled_passkey_flags(scaled), lengths=[8 * l], windows=["full"]),
                r.dir / f"passkey_finetuned_{scaled}.log", out)
        return
    for seed, suffix in _fine_tuning_seeds(o) if method == "passkey_finetuned" else _fine_tuning_seeds(o)[:1]:
        if suffix:  # another fine-tuning seed of the same checkpoint, fine-tuned and probed apart
            tuned = r.dir / f"passkey_ft{suffix}" / "checkpoint_last.pt"
            run(f"finetune {r.name} seed {seed}", finetune_command(passkey_bin, r.ckpt, tuned.parent, list(r.args), o, seed),
                tuned.parent / "train.log", tuned.parent / "train.done", stamp=True)
        out = r.dir / f"{method}{suffix}.json"
        run(f"{method} {r.name}{suffix}", passkey_command(data, tuned, out, o, r.rotary,
                                                          ["--logn"] if method.endswith("_logn") else list(r.probe_flags(o)),
                                                          position_maps=r.position_maps),
            r.dir / f"{method}{suffix}.log", out)
        # the verdict reads 16l too: a trained design's under full attention; a reference method's (a run probed under
        # the windows --probe-windows names) under those windows
        if method == "passkey_finetuned" and _passkey_at_16l(r.role, o.probe_windows):
            out = r.dir / f"passkey_finetuned_16l{suffix}.json"
            windows = ["full"] if is_design(r.role) else None  # (None: the --probe-windows that apply)
            run(f"{method} {r.name} 16l{suffix}", passkey_command(data, tuned, out, o, r.rotary, lengths=[16 * l],
                                                                  windows=windows, position_maps=r.position_maps),
                r.dir / f"passkey_16l{suffix}.log", out)


def _answer_probe(run: Runner, r: _Run, probe: str, work: Path, data: Path, o: ReproduceOptions) -> None:
    """RULER-lite or BABILong-lite: the probe's data-bin once (its encoding is the data-bin's), each run fine-tuned on
    it with ``--answer-only-loss``, then probed; again under each of ``o.extra_seeds`` (``ruler_ft_answers_seedN/``,
    ``ruler_answers_seedN.json``; BABILong-lite's names likewise)."""
    if probe == "ruler":
        bin_dir, done, tuned_dir, budget, report = work / "ruler-bin", RULER_DATA_DONE, RULER_TUNED, RULER_FINETUNE, RULER_REPORT
        data_command, probe_command = ruler_data_command, ruler_command
    else:
        bin_dir, done, tuned_dir, budget, report = (work / "babilong-bin", BABILONG_DATA_DONE, BABILONG_TUNED, BABILONG_FINETUNE,
                                                    BABILONG_REPORT)
        data_command, probe_command = babilong_data_command, babilong_command
    if not (bin_dir / done).exists():
        if probe == "ruler" and bin_dir.exists():  # written before rows recorded their answers: the same rows, written again
            shutil.rmtree(bin_dir)
        run(f"{probe} data", data_command(data, r.ckpt, bin_dir, o), work / f"{probe}-data.log", bin_dir / done)
    # the run's seed under the plain names; each other fine-tuning seed fine-tuned and probed apart (..._seedN)
    for seed, suffix in _fine_tuning_seeds(o):
        tuned = r.dir / f"{tuned_dir}{suffix}" / "checkpoint_last.pt"
        run(f"{probe} finetune {r.name}{suffix}",
            answer_finetune_command(bin_dir, r.ckpt, tuned.parent, list(r.args), o, budget, seed),
            tuned.parent / "train.log", tuned.parent / "train.done", stamp=True)
        out = r.dir / report.replace(".json", f"{suffix}.json")
        run(f"{probe} {r.name}{suffix}", probe_command(data, tuned, out, o, r.rotary, position_maps=r.position_maps,
                                                       extra=r.probe_flags(o)),
            out.with_suffix(".log"), out)


def _run_method(run: Runner, r: _Run, method: str, work: Path, data: Path, o: ReproduceOptions) -> None:
    """One of ``o.methods`` on run ``r``'s last checkpoint: a probe (:data:`PROBES`) or an evaluation-time method
    (:data:`METHODS`, the length evaluation under it)."""
    if method == "passkey":
        out = r.dir / "passkey.json"
        run(f"passkey {r.name}", passkey_command(data, r.ckpt, out, o, r.rotary, r.probe_flags(o), position_maps=r.position_maps),
            r.dir / "passkey.log", out)
    elif method.startswith("passkey_finetuned"):
        _passkey_finetuned(run, r, method, work, data, o)
    elif method in ("ruler", "babilong"):
        _answer_probe(run, r, method, work, data, o)
    elif method in ("longppl", "longppl_common"):
        common = method == "longppl_common"
        out = r.dir / (LONGPPL_COMMON_REPORT if common else LONGPPL_REPORT)
        windows = r.longppl_windows(o)
        run(f"{method} {r.name}", longppl_command(data, r.ckpt, out, o, windows=windows, extra=r.window_flags(windows),
                                                  key_tokens=LONGPPL_KEY_TOKENS if common else None),
            out.with_suffix(".log"), out)
    else:
        out = r.dir / f"method_{method}.json"
        run(f"{method} {r.name}", method_command(data, r.ckpt, method, out, o), r.dir / f"method_{method}.log", out)


def recalibration_choice(rdir: Path, length: int) -> Optional[tuple]:
    """The C of DroPE's recalibration that a run's grid chose: (C, {C: valid ppl}) with the lowest perplexity at
    ``length`` among ``rdir``'s ``valid_C{C}.json`` reports (the first C of :data:`DROPE_TEMPERATURES` on a tie), or
    None while a report of the grid is missing.

    Raises:
        ReproduceError: a report of the grid has no row at ``length``.
    """
    grid = {}
    for c in DROPE_TEMPERATURES:
        path = rdir / f"valid_C{c:g}.json"
        if not path.is_file():
            return None
        rows = [r for r in json.loads(path.read_text())["results"] if int(r["length"]) == length]
        if not rows:
            raise ReproduceError(f"{path} has no row at length {length}: remove it and run again.")
        grid[c] = rows[0]["ppl"]
    return min(grid, key=lambda c: (grid[c], DROPE_TEMPERATURES.index(c))), grid


def _recalibrate(run: Runner, r: _Run, data: Path, o: ReproduceOptions, methods: Sequence[str]) -> None:
    """DroPE's recalibration (arXiv 2512.12167; every logit times beta = 1 + C ln(L / l), ``--attention-temperature C``)
    on a DroPE run, under full attention, into WORK/runs/NAME/recalibrated/: fairseq-eval-lm on the valid split at the
    longest length under each C of :data:`DROPE_TEMPERATURES` (``valid_C{C}.json``); then, under the C with the lowest
    perplexity there (:func:`recalibration_choice`, written to ``choice.json``), the test length evaluation
    (``length_report.json``) and the probes of ``methods`` that the verdict reads, on the checkpoints they were
    fine-tuned into: the passkey at l..8l and 16l and RULER-lite, under each fine-tuning seed the plain run was
    probed with (``o.seed`` and ``o.extra_seeds``), and LongPPL on its own and on the common evaluator's key tokens
    (the plain run's file names, ``..._seedN.json`` for another seed).

    Raises:
        ReproduceError: ``choice.json`` records another C than the grid's reports now choose (a report of the grid was
            made again, or the grid changed): the reports after it would mix two settings.
    """
    rdir, longest = r.dir / RECALIBRATED, max(o.lengths)
    rdir.mkdir(parents=True, exist_ok=True)
    for c in DROPE_TEMPERATURES:
        out = rdir / f"valid_C{c:g}.json"
        run(f"recalibrate {r.name} C={c:g}", eval_command(data, r.ckpt, [longest], ["full"], out, o,
                                                          ["--attention-temperature", c], split="valid"),
            out.with_suffix(".log"), out)
    c, grid = recalibration_choice(rdir, longest)
    chosen = rdir / "choice.json"
    recorded = json.loads(chosen.read_text())["C"] if chosen.exists() else c
    if recorded != c:  # the reports below were made under the recorded C
        raise ReproduceError(f"{chosen} records C = {recorded:g}, but the grid's reports now choose C = {c:g}: remove "
                             f"{rdir} and run again.")
    chosen.write_text(json.dumps({"C": c, "split": "valid", "length": longest, "window": "full",
                                  "ppl": {f"{k:g}": v for k, v in grid.items()}}, indent=1))
    flag, full = ["--attention-temperature", c], replace(o, probe_windows=("full",))
    out = rdir / "length_report.json"
    run(f"eval {r.name} C={c:g}", eval_command(data, r.ckpt, list(o.lengths), ["full"], out, o, flag), rdir / "eval.log", out)
    if "passkey_finetuned" in methods:
        l = o.training_length
        for _, suffix in _fine_tuning_seeds(o):
            tuned = r.dir / f"passkey_ft{suffix}" / "checkpoint_last.pt"
            for out, lengths in ((rdir / f"passkey_finetuned{suffix}.json", None),
                                 (rdir / f"passkey_finetuned_16l{suffix}.json", [16 * l])):
                run(f"passkey_finetuned {r.name} C={c:g}{' 16l' if lengths else ''}{suffix}",
                    passkey_command(data, tuned, out, full, r.rotary, flag, lengths=lengths, windows=["full"]),
                    out.with_suffix(".log"), out)
    if "ruler" in methods:
        for _, suffix in _fine_tuning_seeds(o):
            out = rdir / RULER_REPORT.replace(".json", f"{suffix}.json")
            run(f"ruler {r.name} C={c:g}{suffix}",
                ruler_command(data, r.dir / f"{RULER_TUNED}{suffix}" / "checkpoint_last.pt", out, full, r.rotary,
                              position_maps=r.position_maps, extra=flag), out.with_suffix(".log"), out)
    for method in ("longppl", "longppl_common"):
        if method in methods:
            common = method == "longppl_common"
            out = rdir / (LONGPPL_COMMON_REPORT if common else LONGPPL_REPORT)
            run(f"{method} {r.name} C={c:g}", longppl_command(data, r.ckpt, out, full, windows=r.longppl_windows(full),
                                                              extra=flag, key_tokens=LONGPPL_KEY_TOKENS if common else None),
                out.with_suffix(".log"), out)


def _make_run(name: str, work: Path, o: ReproduceOptions) -> _Run:
    """Run ``name`` of :data:`RUNS` as its steps see it: its training flags (with ``--random-positions`` for a random
    run and ``--drope-start`` for DroPE), its directory, whether it is rotary and has positions to remap.

    Raises:
        ReproduceError: DroPE with fewer than 2 updates.
    """
    run_args, role = run_arguments(name, o.training_length), RUNS[name][1]
    if role == "random":
        run_args = [*run_args, "--random-positions", max(o.lengths)]
    if role == "drope":
        if o.max_update < 2:
            raise ReproduceError(f"{name} drops the positions for the last updates: it needs --max-update >= 2.")
        run_args = [*run_args, "--drope-start", drope_start(o.max_update)]
    pos_emb = str(run_args[run_args.index("--pos-emb") + 1])
    return _Run(name, tuple(run_args), role, work / "runs" / name, pos_emb in ("rope", "xpos"),
                _has_positions(run_args, pos_emb, o.training_length))


def reproduce(work: Path, o: ReproduceOptions, runs: Sequence[str], corpus: Path, data_bin: Optional[Path] = None,
              in_process: bool = False) -> str:
    """Every step of the reproduction, skipping the finished ones: check and record the options
    (:func:`check_options`), prepare the data-bin from ``corpus`` unless it exists, then per run train,
    evaluate (main and random-position runs at every length under full / sliding / BCA; ablations at l and
    8l under full / BCA), measure resolution at l and 2l under full attention and BCA
    (:func:`_train_and_evaluate`), and on the :data:`METHOD_RUNS` checkpoints run ``o.methods`` (:func:`_run_method`;
    RoPE scaling on rotary schemes only), then a DroPE run's recalibration (:func:`_recalibrate`), rewriting the
    results (:func:`write_results`) after each run. Prints each step, then the tables and where they are.

    Args:
        work: the work directory (WORK/runs/RUN/ holds each run's checkpoints, logs and reports).
        o: the options (see the module docstring), already validated.
        runs: names from :data:`RUNS`, in order.
        corpus: CORPUS/{train,valid,test}/*.txt, prepared only when the data-bin has no dict.txt.
        data_bin: the data-bin (default WORK/data-bin).
        in_process: run fairseq's and lex's commands in this process (:class:`Runner`), not each in a new one.

    Returns:
        The text of WORK/tables.md.

    Raises:
        ReproduceError: other options in WORK; DroPE with fewer than 2 updates; a run that takes none of
            ``o.probe_windows`` for one of its probes (these three before anything is written);
            a step failed (re-running continues after the last finished step); a DroPE run's recalibration grid
            that now chooses another C than its reports were made under (:func:`_recalibrate`).
    """
    run_methods = {n: methods_of(n, o.methods) for n in runs}
    budgets = sorted(o.budgets)  # each below max_update (ReproduceOptions checks it)
    made = [_make_run(name, work, o) for name in runs]  # every refusal before anything is written or run
    for r in made:
        for method in run_methods[r.name]:
            if method in PROBES and method != "passkey_finetuned_scaled":  # (that one: 8l, full attention, always)
                try:
                    probe_windows(r.rotary, r.position_maps, o.probe_windows, logn=method.endswith("_logn"))
                except ValueError as e:
                    raise ReproduceError(f"{r.name}, {method}: {e}") from None
    check_options(work, o)
    data = data_bin or work / "data-bin"
    run = Runner(work, _step_count(work, data, runs, run_methods, budgets, len(o.extra_seeds), o.probe_windows),
                 in_process=in_process)
    if not (data / "dict.txt").exists():
        run("prepare", prepare_command(corpus, data), work / "prepare.log", data / "dict.txt")
    for r in made:
        _train_and_evaluate(run, r, data, o, budgets)
        for method in run_methods[r.name]:
            _run_method(run, r, method, work, data, o)
        if r.role == "drope":
            _recalibrate(run, r, data, o, run_methods[r.name])
        write_results(work, o, runs)  # tables grow as runs finish
    text = write_results(work, o, runs)
    print("\n" + text)
    print(f"tables: {work / 'tables.md'}; plot: {work / 'ppl_vs_length.png'}; all numbers: {work / 'results.json'}")
    return text
