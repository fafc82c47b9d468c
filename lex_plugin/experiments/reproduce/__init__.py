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

Every function here takes the options as one frozen value, ``o``: :class:`~.options.ReproduceOptions` (the model,
l, the budget and optimizer, the evaluation lengths and tokens, the methods and probes, the snapshot budgets, bf16
autocast). :data:`PROFILES` names whole settings (``--profile``).
"""

import json
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Optional, Sequence

from ..recipe import PLUGIN_DIR
from ...modules.attention.flags import ATTENTION_FLAGS
from ...modules.layer_pattern import parse_layer_pattern
from .catalogue import (BABILONG_DATA_DONE, BABILONG_FINETUNE, BABILONG_REPORT, BABILONG_TUNED, DEFAULT_RUNS, DROPE_FRACTION,
                        DROPE_TEMPERATURES, LABELS, LONGPPL_PROBE,
                        LONGPPL_REPORT, METHOD_RUNS, METHODS, PASSKEY_FINETUNE, PROBES, PROFILES, RECALIBRATED, RULER_DATA_DONE,
                        PROBE_WINDOWS, RULER_FINETUNE, RULER_REPORT, RULER_TUNED, ROTARY_RUNS, RUNS, SCALED_PASSKEY, SINK_TOKENS,
                        WINDOW_LABEL, methods_of, profile_flags, run_arguments)
from .commands import (answer_finetune_command, babilong_command, babilong_data_command, eval_command, finetune_command,
                       longppl_command, method_command, passkey_command, passkey_data_command, prepare_command, probe_windows,
                       resolution_command, ruler_command, ruler_data_command, scaled_passkey_flags, train_command)
from .options import ReproduceOptions
from .plots import plot_budgets, plot_flat_and_retrieving, plot_ppl
from .runner import ReproduceError, Runner, check_options, fmt_time
from .tables import (check_claims, check_magnitudes, far_context, flat_and_retrieving, markdown_babilong, markdown_budgets,
                     markdown_claims, markdown_far_context, markdown_flat_and_retrieving, markdown_longppl,
                     markdown_magnitudes, markdown_methods, markdown_passkey, markdown_ppl, markdown_recalibration,
                     markdown_resolution, markdown_ruler, ppl_table)

__all__ = [
    "DEFAULT_RUNS", "LABELS", "METHODS", "METHOD_RUNS", "PLUGIN_DIR", "RUNS", "SINK_TOKENS", "WINDOW_LABEL", "ReproduceError",
    "Runner", "check_claims", "check_magnitudes", "check_options", "eval_command", "fmt_time", "markdown_claims", "markdown_methods",
    "markdown_magnitudes", "markdown_passkey", "markdown_ppl", "markdown_resolution", "method_command", "methods_of", "PASSKEY_FINETUNE", "PROBE_WINDOWS", "PROBES",
    "PROFILES", "ReproduceOptions", "probe_windows", "profile_flags",
    "finetune_command", "passkey_command", "passkey_data_command", "plot_ppl", "recalibration_choice",
    "ppl_table", "prepare_command", "reproduce", "resolution_command", "ruler_command", "ruler_data_command",
    "answer_finetune_command", "babilong_command", "babilong_data_command", "longppl_command",
    "scaled_passkey_flags", "train_command", "write_results",
]


@dataclass(frozen=True)
class _Reports:
    """Every finished report of a work directory, read once (:func:`_collect`), and what the tables derive from them."""

    ppl: dict  # {run: {window or method: {length: ppl}}}
    resolution: dict
    passkey: dict  # {probe: {run: report}}
    tuned: dict  # {run: every passkey report after fine-tuning, one list}
    ruler: dict
    longppl: dict
    babilong: dict
    budgets: dict  # {run: {updates: {window: {length: ppl}}}}
    recalibrated: dict  # {DroPE run: {"choice": recalibrated/choice.json, "ppl": {length: test ppl under its C}}}
    main: list
    random_pairs: list
    designs: list  # the trained designs, after the main runs they compare with (rope, none) when those ran
    methods: list
    ablations: list
    claims: list
    flat: list
    magnitudes: list
    verdicts: list
    progress: dict


def _collect(work: Path, o: ReproduceOptions, runs: Sequence[str]) -> _Reports:
    """Read WORK/runs/RUN/*.json and WORK/progress.json, and derive the claims, verdicts and rows of every table."""
    l = o.training_length
    reports, resolution, passkey, ruler, longppl, babilong = {}, {}, {}, {}, {}, {}
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
        if (rdir / RULER_REPORT).exists():
            ruler[name] = json.loads((rdir / RULER_REPORT).read_text())
        if (rdir / LONGPPL_REPORT).exists():
            longppl[name] = json.loads((rdir / LONGPPL_REPORT).read_text())
        if (rdir / BABILONG_REPORT).exists():
            babilong[name] = json.loads((rdir / BABILONG_REPORT).read_text())
        scaled = [json.loads(p.read_text())["results"] for m in SCALED_PASSKEY
                  if (p := rdir / f"passkey_finetuned_{m}.json").exists()]
        if scaled:
            passkey.setdefault("passkey_finetuned_scaled", {})[name] = {"results": [r for rs in scaled for r in rs]}
    # every probe after fine-tuning, one report per run: plain, with log-n, under each RoPE scaling
    tuned = {}
    for probe in ("passkey_finetuned", "passkey_finetuned_logn", "passkey_finetuned_scaled"):
        for name, rep in passkey.get(probe, {}).items():
            tuned.setdefault(name, {"results": []})["results"].extend(rep["results"])
    ppl = ppl_table(reports)
    # the snapshots of each run (o.budgets) and its last checkpoint: {run: {updates: {window: {length: ppl}}}}
    budgets = {}
    for name in runs:
        snaps = {b: json.loads(p.read_text()) for b in o.budgets
                 if (p := work / "runs" / name / f"length_report_u{b}.json").exists()}
        if snaps:
            budgets[name] = {b: ppl_table({name: rep}).get(name, {}) for b, rep in snaps.items()}
            if name in ppl:
                budgets[name][o.max_update] = {w: row for w, row in ppl[name].items() if w in ("full", "sliding", "bca")}
    for name in runs:  # each method's report holds one window: file it under the method's name
        for method in METHODS:
            path = work / "runs" / name / f"method_{method}.json"
            if path.exists():
                rows = ppl_table({name: json.loads(path.read_text())}).get(name, {})
                ppl.setdefault(name, {})[method] = next(iter(rows.values()), {})
    recalibrated = {}
    for name in runs:
        rdir = work / "runs" / name / RECALIBRATED
        if (rdir / "choice.json").exists() and (rdir / "length_report.json").exists():
            rows = ppl_table({name: json.loads((rdir / "length_report.json").read_text())}).get(name, {}).get("full", {})
            recalibrated[name] = {"choice": json.loads((rdir / "choice.json").read_text()), "ppl": rows}
    main = [n for n in runs if RUNS[n][1] == "main"]
    random_pairs = [n for base in ("xpos", "rope", "alibi") for n in (base, f"{base}_random")
                    if n in runs and f"{base}_random" in runs]
    designs = [n for n in runs if _is_design(RUNS[n][1])]
    designs = [n for n in ("rope", "none") if n in runs and designs] + designs
    methods = [m for m in METHODS if any(ppl.get(n, {}).get(m) for n in runs)]
    ablations = [n for n in ("xpos", "xpos_no_rotation", "xpos_scalar_zeta", "rope") if n in runs]
    claims = check_claims(ppl, resolution, l, o.lengths)
    flat = (flat_and_retrieving(ppl, tuned, [n for n in runs if n in METHOD_RUNS], l,
                                o.lengths) if methods else [])
    magnitudes = check_magnitudes(ppl, l, o.lengths, budgets, o.batch_size * l)
    verdicts = far_context(longppl, babilong, l)
    progress = json.loads((work / "progress.json").read_text()) if (work / "progress.json").exists() else {}
    return _Reports(ppl, resolution, passkey, tuned, ruler, longppl, babilong, budgets, recalibrated, main, random_pairs,
                    designs, methods, ablations, claims, flat, magnitudes, verdicts, progress)


def _tables(o: ReproduceOptions, runs: Sequence[str], r: _Reports) -> str:
    """The text of WORK/tables.md."""
    l = o.training_length
    ppl, resolution, passkey, tuned, ruler, longppl, babilong, budgets = (
        r.ppl, r.resolution, r.passkey, r.tuned, r.ruler, r.longppl, r.babilong, r.budgets)
    main, random_pairs, designs, methods, ablations = r.main, r.random_pairs, r.designs, r.methods, r.ablations
    claims, flat, magnitudes, verdicts, progress = r.claims, r.flat, r.magnitudes, r.verdicts, r.progress
    ab_lengths = [l, 8 * l]
    parts = [
        f"Training length l = {l}, {o.arch}, {o.max_update} updates x {o.batch_size} x {l} tokens = "
        f"{o.max_update * o.batch_size * l:,} training tokens per model; test: first {o.eval_tokens:,} tokens "
        "of the test split, cut into non-overlapping windows of each length (every token scored once per length).",
        "", "### Table 2 shape: perplexity by length, each window", "",
        markdown_ppl(ppl, main, ["full", "sliding", "bca"], o.lengths, l),
        "", "### Table 3 shape: attention resolution R(s), mean over layers", "",
        markdown_resolution(resolution, [n for n in runs if n in resolution], [l, 2 * l]),
        "", "### Table 4 shape: xPos ablations at l and 8l", "",
        markdown_ppl(ppl, ablations, ["full", "bca"], ab_lengths, l),
        "", "### Table 5 shape: attention window at 4l and 16l", "",
        markdown_ppl(ppl, main, ["full", "sliding", "bca"], [l, 4 * l, 16 * l], l),
        *(["", "### Extrapolation against training tokens: snapshots of each run", "",
            markdown_budgets(budgets, main, ["full", "sliding", "bca"], o.lengths, l, o.batch_size * l)]
          if budgets else []),
        *(["", "### Magnitudes: ppl(kl) / ppl(l) beside the paper's (Table 2, PG22, l = 1024) and the targets at 16l", "",
            markdown_magnitudes(magnitudes)] if magnitudes else []),
        *(["", "### Randomized positions at training (Ruoss et al. 2023): evaluated with the ordinary positions", "",
            markdown_ppl(ppl, random_pairs, ["full", "sliding", "bca"], o.lengths, l)] if random_pairs else []),
        *(["", "### Trained designs: perplexity by length" + (f" (DroPE: positions dropped from update {_drope_start(o)} "
                                                               f"of {o.max_update})" if "rope_drope" in designs else ""), "",
            markdown_ppl(ppl, designs, ["full", "sliding", "bca"], o.lengths, l)] if designs else []),
        *(["", "### DroPE's recalibration: every logit times beta = 1 + C ln(L / l) at evaluation, C chosen on the valid "
           "split at the longest length", "", markdown_recalibration(r.recalibrated, ppl, o.lengths, l)]
          if r.recalibrated else []),
        *(["", "### Evaluation-time methods on the same checkpoints: perplexity by length", "",
            markdown_methods(ppl, runs, methods, o.lengths, l)] if methods else []),
        *(["", "### Flat and retrieving: perplexity ratio against passkey accuracy at 8l (after fine-tuning)", "",
            markdown_flat_and_retrieving(flat, l, max(o.lengths))] if flat else []),
        *(["", "### Passkey retrieval: accuracy (mean over depths 0.1..0.9; chance 0.10)", "",
            markdown_passkey(passkey["passkey"], runs, l)] if "passkey" in passkey else []),
        *(["", f"### Passkey retrieval after fine-tuning on the probe's format ({PASSKEY_FINETUNE['updates']} updates "
            f"x {PASSKEY_FINETUNE['batch_size']} prompts of at most {l // 2 - 8} tokens)", "",
            markdown_passkey(tuned, runs, l)] if tuned else []),
        *(["", f"### RULER-lite after fine-tuning on its format ({RULER_FINETUNE['updates']} updates x "
            f"{RULER_FINETUNE['batch_size']} prompts of at most l - 1 tokens, the loss on the answers alone; mean over depths)", "",
            markdown_ruler(ruler, runs, l)] if ruler else []),
        *(["", f"### LongPPL: perplexity on the key tokens (the checkpoint's own under full attention; alpha = "
            f"{LONGPPL_PROBE['alpha']}, beta = {LONGPPL_PROBE['beta']} nats)", "",
            markdown_longppl(longppl, runs, l)] if longppl else []),
        *(["", f"### BABILong-lite after fine-tuning on its format ({BABILONG_FINETUNE['tasks']}; "
            f"{BABILONG_FINETUNE['updates']} updates x {BABILONG_FINETUNE['batch_size']} stories of at most l - 1 tokens, "
            "the loss on the answers alone): greedy exact match, mean over the tasks", "",
            markdown_babilong(babilong, runs, l)] if babilong else []),
        *(["", "### Does it use the far context? Flat, reads the far context, retrieves", "",
            markdown_far_context(verdicts, l)] if verdicts else []),
        "", "### Claims", "", markdown_claims(claims),
        "", "### Wall time per step", "", "| step | wall time |", "|---|---:|",
        *[f"| {k} | {fmt_time(v)} |" for k, v in progress.items()],
        f"| **total** | **{fmt_time(sum(progress.values()))}** |",
    ]
    return "\n".join(parts) + "\n"


def _results_json(o: ReproduceOptions, r: _Reports) -> dict:
    """WORK/results.json: the options, ppl, resolution, every probe's results, verdicts, budgets, claims, wall time."""
    ppl, resolution, passkey, ruler, longppl, babilong, budgets = (
        r.ppl, r.resolution, r.passkey, r.ruler, r.longppl, r.babilong, r.budgets)
    claims, magnitudes, verdicts, progress = r.claims, r.magnitudes, r.verdicts, r.progress
    return {"options": o.as_json(), "ppl": {n: {w: {str(L): v for L, v in row.items()} for w, row in d.items()} for n, d in ppl.items()},
            "resolution": {n: {w: {L: r["R"] for L, r in d["lengths"].items()} for w, d in res.items()} for n, res in resolution.items()},
            **{probe: {n: rep["results"] for n, rep in reports.items()} for probe, reports in passkey.items()},
            **({"ruler": {n: rep["results"] for n, rep in ruler.items()}} if ruler else {}),
            **({"longppl": {n: rep["results"] for n, rep in longppl.items()}} if longppl else {}),
            **({"babilong": {n: rep["results"] for n, rep in babilong.items()}} if babilong else {}),
            **({"far_context": verdicts} if verdicts else {}),
            **({"recalibrated": {n: {"choice": rec["choice"], "ppl": {str(L): v for L, v in rec["ppl"].items()}}
                                 for n, rec in r.recalibrated.items()}} if r.recalibrated else {}),
            **({"budgets": {n: {str(b): {w: {str(L): v for L, v in row.items()} for w, row in d.items()} for b, d in snaps.items()}
                            for n, snaps in budgets.items()}} if budgets else {}),
            "claims": claims, "magnitudes": [{**m, "ratios": {str(k): v for k, v in m["ratios"].items()},
                                              "paper": {str(k): v for k, v in m["paper"].items()}} for m in magnitudes],
            "wall_seconds": progress}


def _plots(work: Path, o: ReproduceOptions, runs: Sequence[str], r: _Reports) -> None:
    """WORK/ppl_vs_length.png and, when their runs exist, the methods', flat-and-retrieving, budget and
    randomized-positions plots."""
    l = o.training_length
    ppl, budgets, main, random_pairs, methods, flat = r.ppl, r.budgets, r.main, r.random_pairs, r.methods, r.flat
    if ppl:
        plot_ppl(ppl, main, ["full", "sliding", "bca"], l, work / "ppl_vs_length.png",
                 f"{o.arch}, l = {l}, {o.max_update * o.batch_size * l / 1e6:.2f}M training tokens: test ppl vs length")
    if methods:
        plot_ppl(ppl, [n for n in runs if n in METHOD_RUNS], methods, l, work / "methods_vs_length.png",
                 f"evaluation-time methods on the same checkpoints (l = {l})", {m: METHODS[m][2] for m in methods})
    if flat:
        plot_flat_and_retrieving(flat, l, max(o.lengths), work / "flat_and_retrieving.png")
    if budgets:
        plot_budgets(budgets, main, ["full", "bca"], o.lengths, l, o.batch_size * l, work / "ratio_vs_tokens.png",
                     f"{o.arch}, l = {l}: perplexity ratio against training tokens")
    if random_pairs:
        plot_ppl(ppl, random_pairs, ["full", "sliding", "bca"], l, work / "random_positions_vs_length.png",
                 f"trained with and without randomized positions (L_max = {max(o.lengths)}, l = {l})")


def write_results(work: Path, o: ReproduceOptions, runs: Sequence[str]) -> str:
    """Collect every finished report under WORK/runs/RUN/ (length_report.json, resolution_{full,bca}.json,
    method_METHOD.json, passkey.json) and WORK/progress.json into WORK/tables.md (Tables 2-5 in shape,
    randomized positions, a table per method, passkey accuracy, the claims, wall time per step),
    WORK/results.json (options, ppl, resolution, passkey, claims, wall seconds) and, once there is a
    perplexity, WORK/ppl_vs_length.png (plus methods_vs_length.png and random_positions_vs_length.png when
    those runs exist).

    Returns:
        The text of tables.md.
    """
    reports = _collect(work, o, runs)
    text = _tables(o, runs, reports)
    (work / "tables.md").write_text(text)
    (work / "results.json").write_text(json.dumps(_results_json(o, reports), indent=1))
    _plots(work, o, runs, reports)
    return text


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

    def probe_flags(self, o: ReproduceOptions) -> tuple:
        """:meth:`window_flags` under the probes' modes (:func:`probe_windows`, limited by ``o.probe_windows``)."""
        return self.window_flags(probe_windows(self.rotary, self.position_maps, o.probe_windows))


def _has_sink_token(run_args) -> bool:
    """Whether a run's training flags place a sink token (``--sink-token``): no resolution steps, ``--sink-tokens 1``
    under its bounded windows."""
    return "--sink-token" in map(str, run_args)


def _is_design(role: str) -> bool:
    """Whether a run's role (``catalogue.RUNS``) is a trained design, whose fine-tuned passkey is also probed at 16l."""
    return role in ("design", "drope")


def _has_positions(run_args, pos_emb: str, training_length: int) -> bool:
    """Whether a global layer of the run has positions a position map could remap: every run but a layer pattern
    whose global layers are NoPE (``--layer-pattern``)."""
    if "--layer-pattern" not in run_args:
        return True
    kinds = parse_layer_pattern(str(run_args[run_args.index("--layer-pattern") + 1]), pos_emb, None, training_length)
    return any(k.is_global and k.positions for k in kinds)


def _drope_start(o: ReproduceOptions) -> int:
    """The update from which a DroPE run trains without positions: the last :data:`DROPE_FRACTION` of ``o.max_update``."""
    return o.max_update - max(1, round(DROPE_FRACTION * o.max_update))


def _steps_of(method: str, design: bool = False) -> int:
    """The runner steps of one method on one run (a trained ``design``, or not): a probe after fine-tuning is the
    fine-tuning and its probes (a design's passkey also at 16l)."""
    if method in ("ruler", "babilong"):
        return 2
    if method == "passkey_finetuned_scaled":
        return 1 + len(SCALED_PASSKEY)
    if method == "passkey_finetuned":
        return 3 if design else 2
    return 2 if method.startswith("passkey_finetuned") else 1


def _recalibration_steps(methods: Sequence[str]) -> int:
    """The runner steps of a DroPE run's recalibration (:func:`_recalibrate`) with the probes ``methods``: one valid
    evaluation per C of the grid, the length evaluation, and each probe the verdict reads again (the passkey twice)."""
    return (len(DROPE_TEMPERATURES) + 1 + (2 if "passkey_finetuned" in methods else 0) + ("ruler" in methods)
            + ("longppl" in methods))


def _step_count(work: Path, data: Path, runs: Sequence[str], run_methods: dict, budgets: Sequence[int]) -> int:
    """The number of steps :func:`reproduce` will announce: per run training, evaluation and resolution (4; 2 with a
    sink token), two per budget, its methods' steps, a DroPE run's recalibration; the data-bin and each probe's data
    once, unless already written."""
    tuned = any(m.startswith("passkey_finetuned") for n in runs for m in run_methods[n])
    uses = lambda probe: any(probe in run_methods[n] for n in runs)  # noqa: E731
    return ((0 if (data / "dict.txt").exists() else 1)
            + sum(2 + (0 if _has_sink_token(RUNS[n][0]) else 2) + 2 * len(budgets)
                  + sum(_steps_of(m, _is_design(RUNS[n][1])) for m in run_methods[n])
                  + (_recalibration_steps(run_methods[n]) if RUNS[n][1] == "drope" else 0) for n in runs)
            + (1 if tuned and not (work / "passkey-bin" / "train.idx").exists() else 0)
            + (1 if uses("ruler") and not (work / "ruler-bin" / RULER_DATA_DONE).exists() else 0)
            + (1 if uses("babilong") and not (work / "babilong-bin" / BABILONG_DATA_DONE).exists() else 0))


def _train_and_evaluate(run: Runner, r: _Run, data: Path, o: ReproduceOptions, budgets: Sequence[int]) -> None:
    """Train ``r`` (a snapshot at each budget, each evaluated as the last checkpoint is), evaluate the last
    checkpoint at every length (ablations: l and 8l) under full / sliding / BCA (ablations: full / BCA), and
    measure attention resolution at l and 2l under full attention and BCA (not for a run with a sink token, which the
    analysis refuses)."""
    l, lengths = o.training_length, o.lengths
    ckpt_dir, ckpt = r.ckpt.parent, r.ckpt
    windows = ["full", "bca"] if r.role == "ablation" else ["full", "sliding", "bca"]
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
    if r.sink_token:  # the resolution analysis refuses a sink token (analysis.resolution)
        return
    for w in ("full", "bca"):
        out = r.dir / f"resolution_{w}.json"
        run(f"resolution {r.name} {w}", resolution_command(data, ckpt, [l, 2 * l], w, out, o), r.dir / f"resolution_{w}.log", out)


def _passkey_finetuned(run: Runner, r: _Run, method: str, work: Path, data: Path, o: ReproduceOptions) -> None:
    """The passkey probe after fine-tuning on its format (the probe's data-bin written once): at l..8l
    (``passkey_finetuned``, ``_logn`` with log-n; a trained design's also at 16l under full attention,
    ``passkey_finetuned_16l.json``), or at 8l under each RoPE scaling (``passkey_finetuned_scaled``)."""
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
    out = r.dir / f"{method}.json"
    run(f"{method} {r.name}", passkey_command(data, tuned, out, o, r.rotary,
                                              ["--logn"] if method.endswith("_logn") else list(r.probe_flags(o)),
                                              position_maps=r.position_maps),
        r.dir / f"{method}.log", out)
    if method == "passkey_finetuned" and _is_design(r.role):  # the trained designs' verdict reads 16l too
        out = r.dir / "passkey_finetuned_16l.json"
        run(f"{method} {r.name} 16l", passkey_command(data, tuned, out, o, lengths=[16 * l], windows=["full"]),
            r.dir / "passkey_16l.log", out)


def _answer_probe(run: Runner, r: _Run, probe: str, work: Path, data: Path, o: ReproduceOptions) -> None:
    """RULER-lite or BABILong-lite: the probe's data-bin once (its encoding is the data-bin's), each run fine-tuned on
    it with ``--answer-only-loss``, then probed."""
    if probe == "ruler":
        bin_dir, done, tuned_dir, budget, report = work / "ruler-bin", RULER_DATA_DONE, RULER_TUNED, RULER_FINETUNE, RULER_REPORT
        data_command, probe_command = ruler_data_command, ruler_command
    else:
        bin_dir, done, tuned_dir, budget, report = (work / "babilong-bin", BABILONG_DATA_DONE, BABILONG_TUNED, BABILONG_FINETUNE,
                                                    BABILONG_REPORT)
        data_command, probe_command = babilong_data_command, babilong_command
    tuned = r.dir / tuned_dir / "checkpoint_last.pt"
    if not (bin_dir / done).exists():
        if probe == "ruler" and bin_dir.exists():  # written before rows recorded their answers: the same rows, written again
            shutil.rmtree(bin_dir)
        run(f"{probe} data", data_command(data, r.ckpt, bin_dir, o), work / f"{probe}-data.log", bin_dir / done)
    run(f"{probe} finetune {r.name}", answer_finetune_command(bin_dir, r.ckpt, tuned.parent, list(r.args), o, budget),
        tuned.parent / "train.log", tuned.parent / "train.done", stamp=True)
    out = r.dir / report
    run(f"{probe} {r.name}", probe_command(data, tuned, out, o, r.rotary, position_maps=r.position_maps, extra=r.probe_flags(o)),
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
    elif method == "longppl":
        out = r.dir / LONGPPL_REPORT
        run(f"longppl {r.name}", longppl_command(data, r.ckpt, out, o, r.rotary, position_maps=r.position_maps,
                                                 extra=r.probe_flags(o)),
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
    fine-tuned into: the passkey at l..8l and 16l, RULER-lite, LongPPL (the plain run's file names).

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
        tuned, l = r.dir / "passkey_ft" / "checkpoint_last.pt", o.training_length
        for out, lengths in ((rdir / "passkey_finetuned.json", None), (rdir / "passkey_finetuned_16l.json", [16 * l])):
            run(f"passkey_finetuned {r.name} C={c:g}{' 16l' if lengths else ''}",
                passkey_command(data, tuned, out, full, r.rotary, flag, lengths=lengths, windows=["full"]),
                out.with_suffix(".log"), out)
    if "ruler" in methods:
        out = rdir / RULER_REPORT
        run(f"ruler {r.name} C={c:g}", ruler_command(data, r.dir / RULER_TUNED / "checkpoint_last.pt", out, full, r.rotary,
                                                     position_maps=r.position_maps, extra=flag), out.with_suffix(".log"), out)
    if "longppl" in methods:
        out = rdir / LONGPPL_REPORT
        run(f"longppl {r.name} C={c:g}", longppl_command(data, r.ckpt, out, full, r.rotary, position_maps=r.position_maps,
                                                         extra=flag), out.with_suffix(".log"), out)


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
        run_args = [*run_args, "--drope-start", _drope_start(o)]
    pos_emb = str(run_args[run_args.index("--pos-emb") + 1])
    return _Run(name, tuple(run_args), role, work / "runs" / name, pos_emb in ("rope", "xpos"),
                _has_positions(run_args, pos_emb, o.training_length))


def reproduce(work: Path, o: ReproduceOptions, runs: Sequence[str], corpus: Path, data_bin: Optional[Path] = None) -> str:
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
    run = Runner(work, _step_count(work, data, runs, run_methods, budgets))
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
