#!/usr/bin/env python
"""lm-evaluation-harness's RULER on a ``lex export-hf`` directory, beside ``lex ruler``'s greedy scores.

It runs the RULER tasks of lm-eval that build their data offline: ``niah_single_1`` (a needle in repeated
noise), ``niah_multikey_2`` and ``niah_multikey_3`` (needles only, the latter with UUID keys and values),
``ruler_vt``, ``ruler_cwe`` and ``ruler_fwe``. The essay tasks download Paul Graham's essays, and the QA tasks
download SQuAD and HotpotQA. lm-eval writes each task's 500 prompts per length, sized with the export's own
tokenizer, and decodes greedily for up to each task's ``max_gen_toks``. The score is RULER's
``string_match_all``. The first ``--samples`` prompts of each length are run (lm-eval's ``--samples``).
The command it runs is printed, so it can be reused without this script.

Output: OUT/results_*.json and the samples (lm-eval's own), and OUT/ruler_lm_eval.json, which holds the scores
per task and length. With ``--lex-ruler JSON`` (a ``lex ruler`` report on the same checkpoint), the table puts
lex ruler's greedy exact match (the same ``string_match_all``, on lex ruler's own prompts, mean over depths)
beside lm-eval's.

Needs: lm-eval with its RULER extras (``pip install "lm-eval[ruler]"``: nltk and wonderwords) and
transformers. lex_plugin is not needed. nltk's ``punkt_tab`` download fails offline and is only used by the
essay tasks, so lm-eval prints the error and goes on.
"""

import json
import subprocess
import sys
from pathlib import Path

import click

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lex_plugin.options import given_flags  # noqa: E402  (no torch: the script runs lm-eval in a subprocess)

# lm-eval's task name -> lex ruler's
TASKS = {"niah_single_1": "niah_single_1", "niah_multikey_2": "niah_multikey_2", "niah_multikey_3": "niah_multikey_3",
         "ruler_vt": "vt", "ruler_cwe": "cwe", "ruler_fwe": "fwe"}
PER_LENGTH = 500  # lm-eval's RULER writes this many prompts per length, the lengths in --metadata's order
GEN_TOKENS = 128  # the largest max_gen_toks of these tasks (niah); the context is held to the length plus this
# ruler_vt puts an in-context example of up to 500 tokens before every prompt: below 1,024 the prompt cannot fit, and
# lm-eval 0.4 then retries forever (printing "reduces chain length for not enough noises")
SHORTEST = {"ruler_vt": 1024}


def _ints(value: str):
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r}: give comma-separated integers, e.g. 256,512,1024")
    if not out or min(out) <= 0:
        raise click.BadParameter(f"{value!r}: give one or more positive lengths")
    return out


def lm_eval_command(export: Path, tasks, lengths, samples: int, out: Path) -> list:
    """The lm-eval command line: ``tasks`` at ``lengths`` (``--metadata max_seq_lengths``), the first ``samples``
    prompts of each length (``--samples``), greedy on the CPU in float32, the context limit the longest length plus
    :data:`GEN_TOKENS` (the export's default of 4,096 would cut longer prompts from the left)."""
    picks = {t: [k * PER_LENGTH + i for k in range(len(lengths)) for i in range(samples)] for t in tasks}
    return [str(Path(sys.executable).parent / "lm-eval"), "run", "--model", "hf", "--model_args",
            f"pretrained={export},trust_remote_code=True,max_length={max(lengths) + GEN_TOKENS},dtype=float32",
            "--tasks", ",".join(tasks), "--metadata", json.dumps({"max_seq_lengths": lengths}),
            "--samples", json.dumps(picks), "--batch_size", "1", "--device", "cpu", "--output_path", str(out),
            "--log_samples"]


def lex_greedy(report: dict, window: str) -> dict:
    """{lex task: {length: greedy string_match_all}} of a ``lex ruler`` JSON under ``window``: each length's mean over
    its depths (the cells that fitted)."""
    cells = {}
    for r in report["results"]:
        if r["window"].split("(")[0] == window and r["trials"]:
            cells.setdefault(r["task"], {}).setdefault(int(r["length"]), []).append(r["greedy"] / max(r["queries"], 1))
    return {t: {L: sum(v) / len(v) for L, v in by.items()} for t, by in cells.items()}


@click.command(help=__doc__.split("\n\n")[0])
@click.argument("export", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--lengths", required=True, help="comma-separated lengths in tokens: lm-eval's max_seq_lengths, the prompt and the room for its answer")
@click.option("--samples", type=click.IntRange(1, PER_LENGTH), default=25, show_default=True,
              help=f"prompts per task and length: the first N of lm-eval's {PER_LENGTH}")
@click.option("--tasks", default=",".join(TASKS), show_default=True, help="comma-separated lm-eval RULER tasks")
@click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path), help="output directory")
@click.option("--lex-ruler", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="a lex ruler --json report on the same checkpoint: its greedy scores beside lm-eval's")
@click.option("--lex-window", default="full", show_default=True, help="the lex ruler window compared (the export's)")
@click.option("--lex-lengths", help="the lex ruler length put beside each of --lengths (default the same; lm-eval's "
                                    "length holds the answer's room, up to 128 tokens, lex ruler's the prompt alone)")
def main(export, lengths, samples, tasks, out, lex_ruler, lex_window, lex_lengths):
    unread = given_flags("lex_window", "lex_lengths") if lex_ruler is None else []
    if unread:
        raise click.BadParameter("they choose what of a --lex-ruler report is compared: give --lex-ruler, or drop them",
                                 param_hint=", ".join(unread))
    lengths = _ints(lengths)
    lex_lengths = _ints(lex_lengths) if lex_lengths else lengths
    if len(lex_lengths) != len(lengths):
        raise click.BadParameter(f"give one lex ruler length per lm-eval length ({len(lengths)})", param_hint="--lex-lengths")
    beside = dict(zip(lengths, lex_lengths))
    tasks = [t.strip() for t in tasks.split(",") if t.strip()]
    if not tasks:
        raise click.BadParameter("give at least one task", param_hint="--tasks")
    unknown = [t for t in tasks if t not in TASKS]
    if unknown:
        raise click.BadParameter(f"{unknown}: choose from {', '.join(TASKS)} (the RULER tasks that build their data "
                                 "offline)", param_hint="--tasks")
    short = {t: SHORTEST[t] for t in tasks if t in SHORTEST and min(lengths) < SHORTEST[t]}
    if short:
        raise click.BadParameter(f"{', '.join(f'{t} needs lengths of at least {n}' for t, n in short.items())} "
                                 "(its in-context example alone takes up to 500 tokens, and lm-eval would retry forever); "
                                 "give longer --lengths or leave it out of --tasks", param_hint="--lengths")
    lex = lex_greedy(json.loads(lex_ruler.read_text()), lex_window) if lex_ruler else {}
    if lex_ruler and not lex:
        raise click.BadParameter(f"{lex_ruler} has no scored row under the window {lex_window!r}",
                                 param_hint="--lex-window")
    cmd = lm_eval_command(export, tasks, lengths, samples, out)
    print(" ".join(f"'{c}'" if c.startswith("{") else c for c in cmd), flush=True)
    subprocess.run(cmd, check=True)
    found = sorted(out.rglob("results_*.json"), key=lambda p: p.stat().st_mtime)
    if not found:
        raise click.ClickException(f"lm-eval wrote no results_*.json under {out}")
    results = json.loads(found[-1].read_text())["results"]
    scores = {t: {L: results[t].get(f"{L},none") for L in lengths} for t in tasks}
    (out / "ruler_lm_eval.json").write_text(json.dumps(
        {"export": str(export), "samples": samples, "lengths": lengths, "lm_eval": scores,
         **({"lex_ruler": {t: {str(L): lex.get(TASKS[t], {}).get(beside[L]) for L in lengths} for t in tasks},
             "lex_lengths": {str(L): b for L, b in beside.items()}, "lex_window": lex_window} if lex_ruler else {})},
        indent=1))
    both = " (lm-eval / lex ruler)" if lex_ruler else ""
    print(f"\nRULER, greedy string_match_all{both}, {samples} prompts per task and length\n")
    heads = [f"{L} / {beside[L]}" if lex_ruler else str(L) for L in lengths]
    print("| task | " + " | ".join(heads) + " |\n|---|" + "---:|" * len(lengths))
    for t in tasks:
        cells = []
        for L in lengths:
            a = scores[t][L]
            cell = "-" if a is None or a < 0 else f"{a:.2f}"
            if lex_ruler:
                b = lex.get(TASKS[t], {}).get(beside[L])
                cell += " / " + ("-" if b is None else f"{b:.2f}")
            cells.append(cell)
        print(f"| {t} | " + " | ".join(cells) + " |")
    print(f"\nall numbers: {out / 'ruler_lm_eval.json'}")


if __name__ == "__main__":
    main()
