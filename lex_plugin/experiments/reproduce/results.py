"""The reproduction's results: every finished report collected (:class:`_Reports`), LeX Tables 2-5 in shape, a table
per method and probe, the claims check, the plots and a JSON of everything (:func:`write_results`)."""

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from ...provenance import provenance
from .catalogue import (BABILONG_FINETUNE, BABILONG_REPORT, LONGPPL_PROBE, LONGPPL_REPORT, METHOD_RUNS, METHODS,
                        PASSKEY_FINETUNE, PROBES, RECALIBRATED, RULER_FINETUNE, RULER_REPORT, RUNS, SCALED_PASSKEY,
                        drope_start, is_design)
from .options import ReproduceOptions
from .plots import plot_budgets, plot_flat_and_retrieving, plot_ppl
from .runner import fmt_time
from .probe_tables import (far_context, flat_and_retrieving, markdown_babilong, markdown_far_context,
                           markdown_flat_and_retrieving, markdown_longppl, markdown_ruler)
from .tables import (check_claims, check_magnitudes, markdown_budgets, markdown_claims, markdown_magnitudes, markdown_methods,
                     markdown_passkey, markdown_ppl, markdown_recalibration, markdown_resolution, ppl_table)



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
    designs = [n for n in runs if is_design(RUNS[n][1])]
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
        *(["", "### Trained designs: perplexity by length" + (f" (DroPE: positions dropped from update {drope_start(o.max_update)} "
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
        *(["", "### Does it use the far context? Flat, reads the far context, answers far", "",
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
            "wall_seconds": progress,
            # the steps' wall time summed (over every invocation that ran one); the command, commit and device of this
            # invocation, which wrote the file
            "provenance": provenance(seed=o.seed, wall_s=sum(progress.values()) if progress else None)}


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
    WORK/results.json (options, ppl, resolution, passkey, claims, wall seconds, provenance) and, once there is a
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
