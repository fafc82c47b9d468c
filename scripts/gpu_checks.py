"""The checks a GPU machine owes this project (examples/lex_lm/GPU.md): which SDPA kernels BCA and full attention
run on, equality on the GPU (against the CPU in float64, blockwise against parallel, token by token against
parallel, fp16 / bf16 against fp32), BCA to 256k tokens in fp16 (finite, throughput, peak memory), generation
latency by context, and fairseq-train throughput (tokens/s, achieved TFLOP/s) of xPos, RoPE, ALiBi, NoPE and stock
``transformer_lm`` in fp16, fp32 and bf16 autocast.

    python scripts/gpu_checks.py --out gpu-results [--data DATA-BIN] [--budget-s 420] [--sections kernels,...]

Every section is timed and written as soon as it ends (``DIR/gpu_checks.json``, one JSON object per line, appended
after a ``start`` row with the time and arguments, and the same lines printed), so a run stopped at its limit keeps what it measured; a section that fails records its
error and the next one runs. Sections that would start with less than their estimated time left are skipped and
say so. Without CUDA every section runs on the CPU at toy sizes (a dry run of the script itself).
"""
import argparse
import contextlib
import copy
import json
import re
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path
from unittest import mock

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lex_plugin.evaluation.length_eval import blockwise_forward  # noqa: E402
from lex_plugin.experiments import benchmark  # noqa: E402
from lex_plugin.experiments.recipe import fairseq_train_command  # noqa: E402
from lex_plugin.models.builder import build_random_lm  # noqa: E402
from lex_plugin.modules.attention.kernels import dense, remapped  # noqa: E402
from lex_plugin.modules.attention import AttentionOptions  # noqa: E402
from lex_plugin.options import parse_name_list  # noqa: E402

SECTIONS = ("env", "kernels", "equality", "long", "generation", "train")
# seconds each section needs at least (skipped with less left)
ESTIMATE_S = {"env": 1, "kernels": 20, "equality": 40, "long": 60, "generation": 40, "train": 60}


class Run:
    def __init__(self, out: Path, budget_s: float, cuda: bool):
        self.out, self.deadline, self.cuda = out, time.monotonic() + budget_s, cuda
        self.device = torch.device("cuda" if cuda else "cpu")
        out.mkdir(parents=True, exist_ok=True)
        self.log = open(out / "gpu_checks.json", "a")  # one line per row; each run opens with its start row
        self.emit("start", at=time.strftime("%Y-%m-%d %H:%M:%S"), argv=sys.argv[1:])

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def emit(self, section: str, **row) -> None:
        line = json.dumps({"section": section, **row}, default=str)
        print(line, flush=True)
        self.log.write(line + "\n")
        self.log.flush()

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()

    def timed(self, fn, repeats: int = 2) -> float:
        """Best wall time of ``repeats`` calls after one warm-up, seconds."""
        fn()
        best = float("inf")
        for _ in range(repeats):
            self.sync()
            t = time.perf_counter()
            fn()
            self.sync()
            best = min(best, time.perf_counter() - t)
        return best


def model_on(run: Run, arch: str, l: int, pos_emb: str = "xpos", dtype=torch.float32, seed: int = 0):
    model, d = build_random_lm(arch, vocab_size=benchmark.BENCH_VOCAB_SYMBOLS, tokens_per_sample=l, seed=seed,
                               share_decoder_input_output_embed=True, pos_emb=pos_emb)
    return model.to(device=run.device, dtype=dtype), d


def tokens_for(d, length: int, device, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(d.nspecial, len(d), (1, length), generator=g).to(device)


def log_probs(model, tokens, mode: str, l: int, blockwise: bool = False) -> torch.Tensor:
    spec = AttentionOptions(mode).spec(l)
    view = model.under(spec)
    with torch.no_grad():
        if blockwise:
            out = torch.cat([o for _, _, o in blockwise_forward(view, tokens, spec.window.feed_block)], dim=1)
        else:
            out = view(tokens)[0]
    return F.log_softmax(out.double(), dim=-1)


# --- sections -------------------------------------------------------------------------------------------

def section_env(run: Run, args) -> None:
    row = {"torch": torch.__version__, "python": sys.version.split()[0], "cuda": torch.version.cuda}
    if run.cuda:
        p = torch.cuda.get_device_properties(0)
        row.update(device=p.name, capability=f"{p.major}.{p.minor}", memory_gib=round(p.total_memory / 2**30, 1),
                   sms=p.multi_processor_count, bf16=torch.cuda.is_bf16_supported(),
                   flash_sdp=torch.backends.cuda.flash_sdp_enabled(),
                   mem_efficient_sdp=torch.backends.cuda.mem_efficient_sdp_enabled(),
                   cudnn_sdp=torch.backends.cuda.cudnn_sdp_enabled())
    run.emit("env", **row)


def _kernel_names(run: Run, fn) -> dict:
    """CUDA kernels (or CPU ops) of one call of ``fn`` whose name says attention, with their device time (ms)."""
    fn()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if run.cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        fn()
        run.sync()
    keep = re.compile(r"flash|fmha|efficient|attention|softmax|cudnn|sdpa|bmm", re.I)
    out = {}
    for e in prof.key_averages():
        if keep.search(e.key):
            t = getattr(e, "self_device_time_total", None) if run.cuda else e.self_cpu_time_total
            if t is None:
                t = getattr(e, "self_cuda_time_total", 0)
            if t:
                out[e.key[:120]] = round(t / 1000, 3)
    return dict(sorted(out.items(), key=lambda kv: -kv[1])[:8])


def section_kernels(run: Run, args) -> None:
    """Which SDPA backend each attention path runs on: the profile's attention kernels, and whether the call
    still runs with the math backend switched off."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    l = 1024 if run.cuda else 64
    for dtype_name, dtype in (("fp16", torch.float16), ("bf16", torch.bfloat16), ("fp32", torch.float32)):
        if not run.cuda and dtype != torch.float32:
            continue
        model, d = model_on(run, "lex_lm_small", l, dtype=dtype)
        x = tokens_for(d, 4 * l, run.device)
        for mode, blockwise in (("full", False), ("bca", False), ("bca", True), ("sliding", True)):
            spec = AttentionOptions(mode).spec(l)
            view = model.under(spec)

            def call():
                with torch.no_grad():
                    if blockwise:
                        for _ in blockwise_forward(view, x, spec.window.feed_block, features_only=True):
                            pass
                    else:
                        view(x, features_only=True)

            row = {"dtype": dtype_name, "mode": mode + ("_blockwise" if blockwise else ""), "length": 4 * l,
                   "kernels_ms": _kernel_names(run, call)}
            if run.cuda:
                try:
                    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
                        call()
                    row["runs_without_math_backend"] = True
                except RuntimeError as e:
                    row["runs_without_math_backend"] = False
                    row["error_without_math"] = str(e).splitlines()[0][:200]
            run.emit("kernels", **row)


def section_equality(run: Run, args) -> None:
    """GPU fp32 against the CPU in float64 (the path the test suite checks against naive float64 attention),
    blockwise against parallel and token by token against parallel on the GPU, fp16 and bf16 against fp32."""
    l = 256 if run.cuda else 32
    length = 4 * l
    arch = "lex_lm_small" if run.cuda else "lex_lm_tiny"  # the CPU rehearsal: the same paths on the smallest model
    for pos_emb in ("xpos", "rope", "alibi"):
        model, d = model_on(run, arch, l, pos_emb=pos_emb)
        ref_model, _ = build_random_lm(arch, vocab_size=benchmark.BENCH_VOCAB_SYMBOLS, tokens_per_sample=l,
                                       share_decoder_input_output_embed=True, pos_emb=pos_emb)
        ref_model = ref_model.double()
        half = copy.deepcopy(model).half()
        x = tokens_for(d, length, run.device)
        for mode in ("full", "bca", "sliding"):
            ref = log_probs(ref_model, x.cpu(), mode, l)
            par = log_probs(model, x, mode, l).cpu()
            row = {"pos_emb": pos_emb, "mode": mode, "length": length,
                   "gpu_fp32_vs_cpu_fp64": (par - ref).abs().max().item()}
            if mode != "full":
                blk = log_probs(model, x, mode, l, blockwise=True).cpu()
                row["blockwise_vs_parallel"] = (blk - par).abs().max().item()
            row["fp16_vs_fp64_max"] = (log_probs(half, x, mode, l).cpu() - ref).abs().max().item()
            if run.cuda and torch.cuda.is_bf16_supported():
                bf = model.with_autocast(torch.bfloat16)
                row["bf16_autocast_vs_fp64_max"] = (log_probs(bf, x, mode, l).cpu() - ref).abs().max().item()
            run.emit("equality", **row)
        # token by token (generation) against one parallel forward, under BCA and full attention: the default step
        # (two products on CUDA) and SDPA limited to flash / memory-efficient, the faster candidate (GPU run 2)
        step_paths = {"products": contextlib.nullcontext,
                      "sdpa_flash": lambda: _sdpa_steps([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])}
        for mode in ("bca", "full"):
            spec = AttentionOptions(mode).spec(l)
            view = model.under(spec)
            steps = 2 * l + 16
            par = log_probs(model, x[:, :steps], mode, l).cpu()
            row = {}
            for path, context in step_paths.items():
                state: dict = {}
                with torch.no_grad(), context():
                    outs = [view(x[:, : n + 1], incremental_state=state)[0][:, -1:] for n in range(steps)]
                inc = F.log_softmax(torch.cat(outs, 1).double(), -1).cpu()
                key = "token_by_token_vs_parallel" if path == "products" else f"token_by_token_{path}_vs_parallel"
                row[key] = (inc - par).abs().max().item()
            run.emit("equality", pos_emb=pos_emb, mode=mode, steps=steps, **row)


def section_long(run: Run, args) -> None:
    """BCA (blockwise, bounded cache), sliding window (blockwise) and full attention in fp16 from 1k to 256k
    tokens: finite, tokens/s, peak memory above the weights."""
    l = 1024 if run.cuda else 64
    lengths = [1024, 4096, 16384, 65536, 262144] if run.cuda else [64, 256]
    model, d = model_on(run, "lex_lm_small", l, dtype=torch.float16 if run.cuda else torch.float32)
    for mode in ("bca", "sliding", "full"):
        spec = AttentionOptions(mode).spec(l)
        view = model.under(spec)
        for length in lengths:
            if run.left() < 15:
                run.emit("long", mode=mode, length=length, skipped="out of time")
                return
            if mode == "full" and length > 65536:
                continue
            x = tokens_for(d, length, run.device)
            last = {}

            def call():
                with torch.no_grad():
                    if spec.window.bounded:
                        for a, b, out in blockwise_forward(view, x, spec.window.feed_block, features_only=True):
                            last["h"] = out[:, -8:]
                    else:
                        last["h"] = view(x, features_only=True)[0][:, -8:]

            if run.cuda:
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            try:
                s = run.timed(call, repeats=1 if length > 65536 else 2)
            except torch.OutOfMemoryError as e:
                run.emit("long", mode=mode, length=length, error=str(e).splitlines()[0][:160])
                continue
            with torch.no_grad():
                lp = F.log_softmax(view.decoder.output_layer(last["h"]).float(), -1)
            row = {"mode": mode, "length": length, "dtype": "fp16" if run.cuda else "fp32",
                   "tokens_per_s": round(length / s), "seconds": round(s, 4),
                   "finite": bool(torch.isfinite(last["h"]).all() and torch.isfinite(lp).all())}
            if run.cuda:
                row["peak_mib_above_weights"] = round((torch.cuda.max_memory_allocated() - base) / 2**20, 1)
            run.emit("long", **row)


def _sdpa_steps(backends=None):
    """A context in which one-query generation steps run on SDPA, as they did before ``kernels.ops.step_as_products``
    sent them on CUDA to two products; with ``backends`` (``SDPBackend`` members) SDPA is limited to those."""
    stack = contextlib.ExitStack()
    for kernel in (dense, remapped):  # the two kernels that run one query as products
        stack.enter_context(mock.patch.object(kernel, "step_as_products", lambda q: False))
    if backends:
        stack.enter_context(sdpa_kernel(backends))
    return stack


def section_generation(run: Run, args) -> None:
    """ms per generated token (batch 1, fp16) after a context of N tokens fed block by block; each step the
    default way (``products``: one-query steps as two products on CUDA) and, after it on the same cache, on SDPA
    with every backend (``sdpa``, the old path) and limited to flash / memory-efficient (``sdpa_flash``)."""
    l = 1024 if run.cuda else 64
    contexts = [1024, 16384, 65536] if run.cuda else [64, 256]
    variants = {"products": contextlib.nullcontext, "sdpa": _sdpa_steps,
                "sdpa_flash": lambda: _sdpa_steps([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION])}
    for arch in ("lex_lm_small", "lex_lm_medium") if run.cuda else ("lex_lm_tiny",):
        model, d = model_on(run, arch, l, dtype=torch.float16 if run.cuda else torch.float32)
        for mode in ("bca", "full"):
            view = model.under(AttentionOptions(mode).spec(l))
            for n in contexts:
                if run.left() < 10:
                    run.emit("generation", arch=arch, mode=mode, context=n, skipped="out of time")
                    return
                steps = 32
                x = tokens_for(d, n + len(variants) * (steps + 1) + 1, run.device)
                state: dict = {}
                row = {}
                with torch.no_grad():
                    for _ in blockwise_forward(view, x[:, :n], l // 2, state, features_only=True):
                        pass
                    k = n + 1
                    for name, context in variants.items():
                        with context():
                            view(x[:, :k], incremental_state=state)  # warm-up step
                            k += 1
                            times = []
                            for _ in range(steps):
                                run.sync()
                                t = time.perf_counter()
                                view(x[:, :k], incremental_state=state)
                                run.sync()
                                times.append(time.perf_counter() - t)
                                k += 1
                        row[f"ms_per_token_{name}"] = round(1000 * statistics.median(times), 3)
                run.emit("generation", arch=arch, mode=mode, context=n, **row,
                         cached_positions=int(model.decoder.layers[0].self_attn.cached_keys(state)))


TRAIN_RUNS = [  # (label, arch, model args, precision)
    ("xpos fp16", "lex_lm_small", ["--pos-emb", "xpos"], "fp16"),
    ("xpos fp32", "lex_lm_small", ["--pos-emb", "xpos"], "fp32"),
    ("xpos bf16-autocast", "lex_lm_small", ["--pos-emb", "xpos"], "bf16-autocast"),
    ("rope fp16", "lex_lm_small", ["--pos-emb", "rope"], "fp16"),
    ("alibi fp16", "lex_lm_small", ["--pos-emb", "alibi"], "fp16"),
    ("nope fp16", "lex_lm_small", ["--pos-emb", "none"], "fp16"),
    ("transformer_lm fp16", "transformer_lm", ["--decoder-layers", "6", "--decoder-embed-dim", "512",
                                               "--decoder-attention-heads", "8", "--decoder-ffn-embed-dim", "2048"], "fp16"),
    ("medium xpos fp16", "lex_lm_medium", ["--pos-emb", "xpos"], "fp16"),
    ("medium xpos bf16-autocast", "lex_lm_medium", ["--pos-emb", "xpos"], "bf16-autocast"),
]


def _flops_per_token(params: int, layers: int, dim: int, l: int) -> float:
    """Training FLOPs per token: 6 N for the weights (forward and backward) and 12 layers C l for the attention
    scores and their values (PaLM, appendix B)."""
    return 6 * params + 12 * layers * dim * l


def section_train(run: Run, args) -> None:
    """fairseq-train (the project's recipe) for a few dozen updates per configuration: median words/s of
    fairseq's progress log after the first interval, loss at the last update, achieved TFLOP/s."""
    if args.data is None:
        run.emit("train", skipped="no --data")
        return
    l = 1024 if run.cuda else 64
    batch = 32 if run.cuda else 2
    updates = args.train_updates if run.cuda else 4
    for label, arch, model_args, precision in TRAIN_RUNS:
        if not run.cuda and precision != "fp32":
            continue
        if run.left() < 45:
            run.emit("train", run=label, skipped="out of time")
            continue
        extra = {"fp16": ["--fp16"], "fp32": [], "bf16-autocast": ["--bf16-autocast"]}[precision]
        user_dir = None if arch == "transformer_lm" else Path(__file__).resolve().parent.parent / "lex_plugin"
        cmd = fairseq_train_command(args.data, None, arch=arch, model_args=model_args, tokens_per_sample=l,
                                    batch_size=batch, lr="5e-4", updates=updates, warmup=max(1, updates // 4),
                                    log_format="json", log_interval=max(1, updates // 6), user_dir=user_dir,
                                    extra=extra + ([] if run.cuda else ["--cpu"]))
        t = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=max(30, run.left() - 10))
        except subprocess.TimeoutExpired:
            run.emit("train", run=label, error="timed out")
            continue
        wall = time.perf_counter() - t
        text = proc.stdout + proc.stderr
        if proc.returncode != 0:
            run.emit("train", run=label, error=text[-1500:])
            continue
        inner = [json.loads(m) for m in re.findall(r"\| train_inner \| (\{.*\})", text)]
        final = [json.loads(m) for m in re.findall(r"\| train \| (\{.*\})", text)]
        params = int(re.search(r"num\. shared model params: ([\d,]+)", text).group(1).replace(",", "")) if re.search(
            r"num\. shared model params: ([\d,]+)", text) else None
        wps = [float(r["wps"]) for r in inner[1:]] or [float(r["wps"]) for r in inner]
        row = {"run": label, "updates": updates, "tokens_per_update": batch * l, "wall_s": round(wall, 1),
               "wps_median": round(statistics.median(wps)) if wps else None,
               "loss_last": inner[-1]["loss"] if inner else None, "loss_epoch": final[-1]["train_loss"] if final else None,
               "params": params}
        if params and wps:
            dims = {"lex_lm_small": (6, 512), "transformer_lm": (6, 512), "lex_lm_medium": (24, 1024)}[arch]
            row["tflops"] = round(statistics.median(wps) * _flops_per_token(params, *dims, l) / 1e12, 1)
        run.emit("train", **row)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--data", type=Path, default=None, help="a data-bin for the train section")
    p.add_argument("--budget-s", type=float, default=420.0, help="stop starting sections after this many seconds")
    p.add_argument("--sections", default=",".join(SECTIONS))
    p.add_argument("--train-updates", type=int, default=60)
    args = p.parse_args()
    sections = parse_name_list(args.sections, "--sections")
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        p.error(f"--sections: unknown {unknown}; choose among {', '.join(SECTIONS)}")
    run = Run(args.out, args.budget_s, torch.cuda.is_available())
    for name in sections:
        if run.left() < ESTIMATE_S[name]:
            run.emit(name, skipped=f"{run.left():.0f} s left")
            continue
        t = time.perf_counter()
        try:
            globals()[f"section_{name}"](run, args)
            run.emit(name, done_s=round(time.perf_counter() - t, 1))
        except Exception as e:  # one failed section must not stop the others: its error is the result
            run.emit(name, error=f"{type(e).__name__}: {e}", trace=traceback.format_exc()[-2000:])


if __name__ == "__main__":
    main()
