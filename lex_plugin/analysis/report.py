"""The analysis runs behind ``lex resolution``, ``lex decay-curve`` and ``lex receptive-field``: load a
checkpoint and a split, average the measurements over texts, and write a table, JSON and a PNG."""

import json
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Union

import torch

from ..data.stream import split_stream  # re-exported: callers import it from here
from ..evaluation.length_eval import progress_bar
from ..modules.attention.spec import AttentionOptions, AttentionSpec
from .first_token import first_token_mass
from .receptive_field import cumulative_gradient, effective_receptive_field, theoretical_receptive_field
from .resolution import attention_resolution, expectation_curve, score_by_distance

__all__ = ["decay_curve_report", "first_token_report", "format_first_token", "load_model", "receptive_field_report",
           "resolution_report", "split_stream"]


def load_model(checkpoint: Path, data: Path, options: AttentionOptions, evaluation_length: Optional[int] = None,
               bf16_autocast: bool = False, device: Union[str, torch.device] = "cpu"):
    """The lex_lm model of ``checkpoint`` (eval, fp32 weights, on ``device``; under bf16 autocast with
    ``bf16_autocast``), its dictionary, and the attention spec of ``options`` for it (``AttentionOptions.spec``;
    ValueError as there)."""
    from ..hub_interface import from_pretrained

    hub = from_pretrained(checkpoint.parent, checkpoint.name, data, bf16_autocast=bf16_autocast, device=device)
    spec = hub.spec_for(options, evaluation_length)
    model = hub.models[0].float()
    model.eval()  # (the hub's model returns None from eval(): fairseq's make_generation_fast_)
    return model, hub.task.source_dictionary, spec


def _segments(stream: torch.Tensor, length: int, count: int) -> List[torch.Tensor]:
    n = min(count, stream.numel() // length)
    if n == 0:
        raise ValueError(f"the split has {stream.numel():,} tokens, fewer than one text of {length}; lower the length.")
    return [stream[i * length:(i + 1) * length] for i in range(n)]


def _plot(out: Path, curves: Dict[str, Sequence[float]], xlabel: str, ylabel: str, title: str, logx: bool = False):
    from ..plotting import figure

    with figure(out, size=(7, 4.2)) as (_, ax):
        for label, ys in curves.items():
            ax.plot(range(len(ys)), list(ys), label=label, linewidth=1.2)
        if logx:
            ax.set_xscale("symlog", linthresh=1)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)


def first_token_report(model, stream: torch.Tensor, length: int, texts: int = 8, batch_size: int = 4,
                       progress: bool = True) -> dict:
    """The attention on position 0 under full attention (:func:`~.first_token.first_token_mass`) over ``texts`` texts
    of ``length`` tokens of ``stream``: per layer the mean over heads and the heads' range, and the mean over the
    layers measured (a pattern's local layers are not: their three figures None).

    Returns:
        {"length", "texts", "mean", "layers": [{"layer", "mean", "min_head", "max_head"}]}.
    """
    device = next(model.parameters()).device
    segments = _segments(stream, length, texts)
    total = None
    for i in progress_bar(range(0, len(segments), batch_size), f"first token L={length}", "batch", progress):
        batch = torch.stack(segments[i:i + batch_size]).to(device)
        part = first_token_mass(model, batch) * batch.size(0)
        total = part if total is None else total + part
    mass = total / len(segments)  # (layers, H)
    layers = [{"layer": i, "mean": None, "min_head": None, "max_head": None} if bool(row.isnan().any()) else
              {"layer": i, "mean": float(row.mean()), "min_head": float(row.min()), "max_head": float(row.max())}
              for i, row in enumerate(mass)]
    measured = mass[~mass.isnan().any(dim=1)]
    return {"length": length, "texts": len(segments), "mean": float(measured.mean()), "layers": layers}


def format_first_token(report: dict) -> str:
    """Markdown: the attention on position 0 per layer (mean over heads, the heads' range; "-" for a pattern's local
    layer, not measured), then the mean over the layers measured."""
    lines = [f"Attention on the first token, full attention, {report['texts']} texts of {report['length']} tokens "
             "(mean over queries 1 .. L - 1)", "", "| layer | mean | lowest head | highest head |", "|---|---:|---:|---:|"]
    for r in report["layers"]:
        cells = ["-" if r[k] is None else f"{r[k]:.3f}" for k in ("mean", "min_head", "max_head")]
        lines.append(f"| {r['layer']} | " + " | ".join(cells) + " |")
    return "\n".join(lines + [f"| all measured | {report['mean']:.3f} | | |"])


def resolution_report(model, stream: torch.Tensor, lengths: Sequence[int], spec: AttentionSpec, texts: int = 8,
                      batch_size: int = 4, progress: bool = True) -> dict:
    """Attention resolution at each length: s[n] per layer (mean over texts, heads and queries), R(s) per
    layer (Eq. 4) and their mean over layers (the LeX Table 3 protocol), under ``spec``.

    Returns:
        {"window": str, "lengths": {L: {"texts", "R", "R_layers", "s": per-layer lists}}}.
    """
    device = next(model.parameters()).device
    out = {"window": str(spec), "attention": spec.fields(), "lengths": {}}
    for length in lengths:
        segments = _segments(stream, length, texts)
        sums = counts = None
        for i in progress_bar(range(0, len(segments), batch_size), f"resolution L={length}", "batch", progress):
            batch = torch.stack(segments[i:i + batch_size]).to(device)
            s, c = score_by_distance(model, batch, spec)
            sums, counts = (s, c) if sums is None else (sums + s, counts + c)
        seen = counts > 0
        per_layer = sums[:, :, seen].mean(1) / counts[seen]  # (layers, D): mean over heads of the mean logit
        r_layers = [attention_resolution(row) for row in per_layer]
        out["lengths"][str(length)] = {
            "texts": len(segments), "R": sum(r_layers) / len(r_layers), "R_layers": r_layers,
            "s": [row.tolist() for row in per_layer],
        }
    return out


def format_resolution(report: dict) -> str:
    """Markdown table: length, window, R (mean over layers), R per layer."""
    rows = ["| length | window | texts | R (mean over layers) | R per layer |", "|---|---|---|---|---|"]
    for length, r in report["lengths"].items():
        layers = ", ".join(f"{v:.4f}" for v in r["R_layers"])
        rows.append(f"| {length} | {report['window']} | {r['texts']} | {r['R']:.4f} | {layers} |")
    return "\n".join(rows)


def plot_resolution(report: dict, out: Path):
    curves = {}
    for length, r in report["lengths"].items():
        curves[f"L={length}, {report['window']} (mean over layers)"] = torch.tensor(r["s"]).mean(0).tolist()
    _plot(out, curves, "distance n", "s[n]: mean pre-softmax logit", "Expected attention score by distance", logx=True)


def decay_curve_report(head_dim: int, gamma: float, scale_base: float, max_distance: int) -> dict:
    """g[n] (Eq. 10) for RoPE and xPos and R(g) of each; the Figure 2 comparison."""
    curves = {"rope": expectation_curve(head_dim, max_distance, rope=True),
              "xpos": expectation_curve(head_dim, max_distance, gamma, scale_base)}
    return {"head_dim": head_dim, "gamma": gamma, "scale_base": scale_base, "max_distance": max_distance,
            "R": {k: attention_resolution(v) for k, v in curves.items()},
            "g": {k: v.tolist() for k, v in curves.items()}}


def format_decay_curve(report: dict) -> str:
    g = report["g"]
    marks = [n for n in (0, 1, 16, 128, 512, 1024, 2048, 4096, 8192, 16384) if n <= report["max_distance"]]
    head = "| scheme | R(g) | " + " | ".join(f"g[{n}]" for n in marks) + " |"
    rows = [head, "|---|---|" + "---|" * len(marks)]
    for k in ("rope", "xpos"):
        rows.append(f"| {k} | {report['R'][k]:.6f} | " + " | ".join(f"{g[k][n]:.3f}" for n in marks) + " |")
    return "\n".join(rows)


def plot_decay_curve(report: dict, out: Path):
    _plot(out, {f"{k} (R = {report['R'][k]:.4f})": v for k, v in report["g"].items()}, "relative distance n",
          "g[n]", f"Expectation of the logit by distance (d = {report['head_dim']}, gamma = {report['gamma']}, "
          f"B = {report['scale_base']:g})")


def receptive_field_report(model, stream: torch.Tensor, length: int, spec: AttentionSpec, segments: int = 8,
                           progress: bool = True) -> dict:
    """Cumulative normalized gradient c_m averaged over ``segments`` texts of ``length`` inputs, the ERF of
    the average, and the theoretical bound of the window and depth."""
    texts = _segments(stream, length + 1, segments)
    device = next(model.parameters()).device
    s = torch.zeros(length, dtype=torch.float64)
    for text in progress_bar(texts, f"receptive field L={length}", "text", progress):
        s += cumulative_gradient(model, text.to(device), spec)["s"].cpu()
    s /= len(texts)
    c = s.cumsum(0)
    return {"window": str(spec), "attention": spec.fields(), "length": length, "segments": len(texts),
            "erf": effective_receptive_field(c), "theoretical": theoretical_receptive_field(spec.window, model.decoder.num_layers, length),
            "s": s.tolist(), "c": c.tolist()}


def format_receptive_field(report: dict) -> str:
    c = report["c"]
    marks = [m for m in (0, 16, 64, 256, 1024, 4096) if m < len(c)]
    head = "| window | length | segments | ERF (c > 0.99) | theoretical | " + " | ".join(f"c[{m}]" for m in marks) + " |"
    rows = [head, "|---|---|---|---|---|" + "---|" * len(marks)]
    rows.append(f"| {report['window']} | {report['length']} | {report['segments']} | {report['erf']} | {report['theoretical']} | "
                + " | ".join(f"{c[m]:.4f}" for m in marks) + " |")
    return "\n".join(rows)


def plot_receptive_field(report: dict, out: Path):
    _plot(out, {f"{report['window']}, L={report['length']} (ERF {report['erf']})": report["c"]},
          "distance m from the last input", "c_m: cumulative normalized gradient",
          "Receptive field (Chi et al., cumulative normalized gradient)", logx=True)


def write_json(report: dict, path: Optional[Path], provenance: Optional[dict] = None):
    """Write ``report`` as JSON to ``path`` (None: nothing), its parent made; with ``provenance`` (``lex_plugin.provenance``)
    under the report's ``"provenance"`` key."""
    if path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report if provenance is None else {**report, "provenance": provenance}, indent=1))
