"""fairseq-train's progress log read back: the training loss by update, and two runs' curves compared.

fairseq 0.12 writes one ``train_inner`` line every ``--log-interval`` updates, in the ``simple`` format
(``epoch 001:  25 / 1922 loss=9.105, ppl=550.5, ..., num_updates=25, ...``) or the ``json`` format
(``{"epoch": 1, "loss": "9.105", ..., "num_updates": "25", ...}``), after ``date | INFO | train_inner | `` on
stdout and bare in the ``--log-file`` copy. Its ``loss`` is the cross-entropy in bits per token (base 2). :func:`read_train_log` reads either
format; :func:`compare_curves` puts two runs side by side (bf16 autocast against fp32, say).
"""

import json
import math
import re
from pathlib import Path
from typing import Dict, List, Sequence, Union

__all__ = ["compare_curves", "markdown_curves", "plot_curves", "read_train_log", "read_valid_log"]

# an interval line, with fairseq's "date | INFO | train_inner | " before it on stdout and bare in --log-file (a
# plain FileHandler): simple "epoch 001:  25 / 1922 k=v, ..."; json an object with a bare "num_updates" (the
# end-of-epoch summaries prefix their keys, train_num_updates / valid_num_updates, and print " | " separated)
_JSON = re.compile(r"(\{.*\})\s*$")
_SIMPLE = re.compile(r"(?:^|\| )epoch \d+:\s+\d+ / \d+ (.*)$")
_PAIR = re.compile(r"(\w+)=([^,\s]+)")
# a validation line: simple "epoch 001 | valid on 'valid' subset | loss 7.77 | ppl 218.2 | ... | num_updates 300"
_VALID = re.compile(r"valid on '([^']+)' subset \| (.*)$")


def _add_stats(out: Dict[int, Dict[str, float]], pairs) -> None:
    """Put one logged line's (key, value) pairs into ``out`` under its ``num_updates``, numbers only (a later line of
    the same update replaces the earlier); a line without ``num_updates`` is left out."""
    stats = {}
    for key, value in pairs:
        try:
            stats[key] = float(value)
        except (TypeError, ValueError):
            continue
    if "num_updates" in stats:
        out[int(stats.pop("num_updates"))] = stats


def read_train_log(text: Union[str, Path]) -> Dict[int, Dict[str, float]]:
    """The ``train_inner`` statistics of a fairseq-train log, by update.

    Args:
        text: the log's text, or a path to it (stdout of fairseq-train or its ``--log-file``; the ``simple``
            or ``json`` ``--log-format``; lines of other kinds are skipped).

    Returns:
        {num_updates: {statistic: value}}, e.g. ``loss`` (bits per token), ``ppl``, ``wps``, ``lr``, ``gnorm``;
        numbers only. When a log holds the same update twice (a run resumed before its next checkpoint), the
        later line wins: it is the run that went on.

    Raises:
        ValueError: no ``train_inner`` line (a ``tqdm`` or ``none`` log format, or not a fairseq-train log).
    """
    if isinstance(text, Path):
        text = text.read_text(errors="replace")
    out: Dict[int, Dict[str, float]] = {}
    for line in text.splitlines():
        if m := _JSON.search(line):
            try:
                pairs = json.loads(m.group(1))
            except json.JSONDecodeError:
                continue
            if not isinstance(pairs, dict) or "num_updates" not in pairs:
                continue
            pairs = pairs.items()
        elif m := _SIMPLE.search(line):
            pairs = _PAIR.findall(m.group(1))
        else:
            continue
        _add_stats(out, pairs)
    if not out:
        raise ValueError("no train_inner line found: give fairseq-train's output or --log-file written with "
                         "--log-format simple or json (tqdm and none print no per-interval lines to a file).")
    return out


def compare_curves(a: Dict[int, Dict[str, float]], b: Dict[int, Dict[str, float]], after: int = 0,
                   key: str = "loss") -> dict:
    """Two runs' ``key`` curves at the updates both logged.

    Args:
        a, b: :func:`read_train_log` outputs (a is the reference).
        after: the summary covers updates > ``after`` only (the warm-up, where curves move fastest, left out).
        key: the statistic compared (``loss``: bits per token).

    Returns:
        ``{"rows": [{"update", "a", "b", "relative"}...], "max_relative": float, "at": int, "final_relative": float,
        "after": int}``: ``relative`` = b / a - 1 at each common update; the largest ``|relative|`` past ``after``
        and where it is; the relative gap at the last common update.

    Raises:
        ValueError: no common update past ``after`` carries ``key``, or a value is not finite and positive.
    """
    common = sorted(u for u in a.keys() & b.keys() if key in a[u] and key in b[u])
    rows: List[dict] = []
    for u in common:
        x, y = a[u][key], b[u][key]
        if not (math.isfinite(x) and math.isfinite(y) and x > 0):
            raise ValueError(f"{key} at update {u} is {x} and {y}: a diverged run has no relative gap.")
        rows.append({"update": u, "a": x, "b": y, "relative": y / x - 1})
    past = [r for r in rows if r["update"] > after]
    if not past:
        raise ValueError(f"the two logs share no update past {after} with a {key!r}: same --log-interval and "
                         f"--max-update? (updates of a: {min(a)}..{max(a)}, of b: {min(b)}..{max(b)})")
    worst = max(past, key=lambda r: abs(r["relative"]))
    return {"rows": rows, "max_relative": abs(worst["relative"]), "at": worst["update"],
            "final_relative": past[-1]["relative"], "after": after}


def markdown_curves(result: dict, labels: Sequence[str], key: str = "loss") -> str:
    """:func:`compare_curves`' rows as a markdown table (update, each run's value, the relative gap in %)."""
    rows = [f"| update | {key} ({labels[0]}) | {key} ({labels[1]}) | {labels[1]} / {labels[0]} - 1 |",
            "|---:|---:|---:|---:|"]
    rows += [f"| {r['update']:,} | {r['a']:.4f} | {r['b']:.4f} | {100 * r['relative']:+.2f}% |" for r in result["rows"]]
    return "\n".join(rows)


def plot_curves(result: dict, labels: Sequence[str], out: Path, title: str, key: str = "loss") -> None:
    """Write the PNG ``out``: both curves against updates (top) and the relative gap in % (bottom), the
    summary's start (``after``) as a dotted line."""
    from ..plotting import figure

    rows = result["rows"]
    updates = [r["update"] for r in rows]
    with figure(out, 2, 1, (7.5, 6.5), dpi=110, sharex=True, gridspec_kw={"height_ratios": [2, 1]}) as (fig, (top, bottom)):
        top.plot(updates, [r["a"] for r in rows], label=labels[0])
        top.plot(updates, [r["b"] for r in rows], label=labels[1], linestyle="--")
        top.set_ylabel(f"training {key}" + (" (bits per token)" if key == "loss" else ""))
        top.legend()
        bottom.plot(updates, [100 * r["relative"] for r in rows], color="black")
        bottom.axhline(0, color="grey", linewidth=1)
        bottom.set_ylabel(f"{labels[1]} / {labels[0]} - 1 (%)")
        bottom.set_xlabel("update")
        for ax in (top, bottom):
            ax.axvline(result["after"], color="grey", linestyle=":", linewidth=1)
            ax.grid(alpha=0.3)
        fig.suptitle(title)


def read_valid_log(text: Union[str, Path], subset: str = "valid") -> Dict[int, Dict[str, float]]:
    """The validation statistics of a fairseq-train log, by update: each line fairseq writes after validating
    ``subset`` (``--validate-interval-updates``, the end of an epoch).

    Args:
        text: the log's text, or a path to it (as :func:`read_train_log`: ``simple`` or ``json`` ``--log-format``).
        subset: the validation split (fairseq's ``--valid-subset``).

    Returns:
        {num_updates: {statistic: value}}, e.g. ``loss`` (bits per token), ``ppl``; numbers only; the later line of an
        update given twice (a resumed run).

    Raises:
        ValueError: no validation line of ``subset``.
    """
    if isinstance(text, Path):
        text = text.read_text(errors="replace")
    out: Dict[int, Dict[str, float]] = {}
    prefix = f"{subset}_"
    for line in text.splitlines():
        if m := _VALID.search(line):
            if m.group(1) != subset:
                continue
            pairs = [part.strip().split(" ", 1) for part in m.group(2).split(" | ")]
            pairs = [(p[0], p[1]) for p in pairs if len(p) == 2]
        elif (m := _JSON.search(line)) and f'"{prefix}num_updates"' in line:
            try:
                pairs = [(k[len(prefix):], v) for k, v in json.loads(m.group(1)).items() if k.startswith(prefix)]
            except json.JSONDecodeError:
                continue
        else:
            continue
        _add_stats(out, pairs)
    if not out:
        raise ValueError(f"no validation line of subset {subset!r} found: give fairseq-train's output or --log-file "
                         "(--log-format simple or json) of a run that validated.")
    return out
