"""The benchmarks' tables from their reports (``--json-out`` of ``scripts/bench_limits.py`` and
``scripts/bench_design_costs.py``: ``{"provenance", "rows"}``), as BENCHMARKS.md shows them (``scripts/results.py``
writes them there) and the scripts print them."""

from typing import List

from .benchmark import markdown_table
from ..provenance import UNKNOWN
from ..rounding import written

__all__ = ["design_costs_markdown", "limits_markdown", "provenance_line"]


def provenance_line(prov: dict) -> str:
    """One line: when, on what, at which commit, how long, by which command (a report's ``provenance``); a field
    nothing recorded (``"unknown"``, :mod:`lex_plugin.provenance`) is said to be unrecorded."""
    def known(key: str, text: str, unrecorded: str) -> str:
        return unrecorded if prov[key] == UNKNOWN else text

    dirty = " (uncommitted changes)" if prov.get("dirty") is True else ""
    return (f"Measured {known('date', prov['date'], 'at an unrecorded date')} "
            f"on {known('device', prov['device'], 'an unrecorded device')}, "
            f"{known('torch', 'torch ' + str(prov['torch']), 'torch unrecorded')}, "
            f"{known('commit', 'commit ' + str(prov['commit'])[:10] + dirty, 'commit unrecorded')}, "
            f"{known('wall_s', str(prov['wall_s']) + ' s', 'wall time unrecorded')}: "
            f"{known('command', '`' + str(prov['command']) + '`', 'command unrecorded')}.")


def design_costs_markdown(rows: List[dict]) -> str:
    """Each design against its base model (``experiments.design_costs``): evaluation seconds and their ratio,
    generation ms per token and their ratio, the key/value positions kept at 64k and their ratio; the two ratios the
    verdict judges (time and cache) written as it writes them (``rounding.written``: 1.105 is "1.11x", not "1.10x")."""
    return markdown_table(
        ["run", "eval s (design / base)", "eval time", "gen ms/token (design / base)", "gen time",
         "cache 64k (positions, design / base)", "cache"],
        [[r["run"], f"{r['eval_s']['design']:.2f} / {r['eval_s']['base']:.2f}", written(r["eval_time"], "{:.2f}x"),
          f"{r['ms_per_token']['design']:.2f} / {r['ms_per_token']['base']:.2f}", f"{r['gen_time']:.2f}x",
          f"{sum(r['kept']['design']):,} / {sum(r['kept']['base']):,}", written(r["cache_64k"], "{:.3f}x")] for r in rows])


def limits_markdown(report: dict) -> str:
    """BENCHMARKS.md's tables of a report (``--json-out``'s): generation, then prefill, then the provenance line."""
    rows, prov = report["rows"], report["provenance"]
    out = []
    gen = [r for r in rows if r["section"] == "generation"]
    if gen:
        out += ["| context | lex full | eager full | lex / eager | lex BCA | eager BCA | lex / eager | "
                "bf16 / fp32: full | BCA | DCA |", "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for r in gen:
            ms = r["ms"]
            out.append(f"| {r['context']:,} | {ms['lex full']:.2f} ms | {ms['eager full']:.2f} ms | "
                       f"{r['lex_full_vs_eager_full']:.2f} | {ms['lex bca']:.2f} ms | {ms['eager bca']:.2f} ms | "
                       f"{r['lex_bca_vs_eager_bca']:.2f} | {r['bf16_vs_fp32_full']:.2f} | {r['bf16_vs_fp32_bca']:.2f} | "
                       f"{r['bf16_vs_fp32_dca']:.2f} |")
    pre = [r for r in rows if r["section"] == "prefill"]
    if pre:
        out += ["", f"Prefill, % of the run's best fp32 matmul ({pre[0]['best_mm_gflops']:.0f} GFLOP/s); in brackets "
                "against the matmul timed right after the point:", "",
                "| mode | length | model GFLOP/s | model | one layer's attention alone | attention's share of the FLOPs |",
                "|---|---:|---:|---:|---:|---:|"]
        for r in pre:
            out.append(f"| {r['mode']} | {r['length']:,} | {r['gflops']:.1f} | {100 * r['fraction_of_best_mm']:.1f}% "
                       f"({100 * r['fraction_of_mm']:.1f}%) | {100 * r['attention_fraction_of_best_mm']:.1f}% "
                       f"({100 * r['attention_fraction_of_mm']:.1f}%) | {100 * r['attention_share_of_flops']:.0f}% |")
    out += ["", provenance_line(prov)]
    return "\n".join(out)
