"""What the reproduction runs: the training runs (schemes, ablations, randomized positions), the
evaluation-time methods and probes on their checkpoints, and the labels the tables and plots print."""

from pathlib import Path
from typing import Dict, List, Sequence

__all__ = ["BABILONG_DATA_DONE", "BABILONG_FINETUNE", "BABILONG_PROBE", "BABILONG_REPORT", "BABILONG_TUNED",
           "CHOOSES_KEYS", "DEFAULT_RUNS", "DROPE_FRACTION", "DROPE_TEMPERATURES", "LABELS", "LOCAL_WINDOW_DIVISOR", "full_attention_only", "run_arguments", "LONGPPL_COMMON_REPORT", "LONGPPL_KEY_TOKENS", "LONGPPL_PROBE", "LONGPPL_REPORT", "METHODS", "METHOD_RUNS", "PASSKEY_FINETUNE", "PROBE_WINDOWS", "PROBES",
           "PROFILES", "profile_flags", "RECALIBRATED", "RULER_FINETUNE", "RULER_PROBE", "ROTARY_RUNS", "RUNS", "SCALED_PASSKEY", "SCALINGS", "SINK_TOKENS",
           "WINDOW_LABEL", "drope_start", "is_design", "methods_of"]

# name -> (fairseq-train arguments, role). "main" runs are the paper's Table 2 baselines; "ablation" runs
# are Table 4's xPos variants (zeta = 1 is RoPE, which the main runs already hold); "random" runs train with
# randomized positions (Ruoss et al. 2023, --random-positions L_max with L_max the longest evaluation length)
# and are evaluated like the main runs, with the ordinary positions. "design" runs train a design the released models
# ship (issue: trained to extrapolate): QK-norm, Scalable-Softmax, Llama 4's NoPE with temperature tuning, and DroPE
# ("drope": RoPE with QK-norm, positions dropped for the last DROPE_FRACTION of the updates), and the layer patterns
# (--layer-pattern; "{w}" stands for the local window l / LOCAL_WINDOW_DIVISOR): local xPos under BCA with a global NoPE
# layer and Llama 4's temperature tuning, Cohere's RNoPE-SWA (3 sliding RoPE layers : 1 global NoPE), Gemma's 5 sliding :
# 1 global (RoPE; six layers, since the 4-layer preset cannot hold it) and Llama 4's iRoPE (chunked RoPE, global NoPE with
# temperature tuning); evaluated like the main runs, the evaluation's windows on their global layers.
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
    "rope_qknorm": (["--pos-emb", "rope", "--qk-norm"], "design"),
    "rope_ssmax": (["--pos-emb", "rope", "--ssmax"], "design"),
    "none_tt": (["--pos-emb", "none", "--temperature-tuning-beta", 0.1], "design"),
    "rope_drope": (["--pos-emb", "rope", "--qk-norm"], "drope"),
    "xpos_bca_nope": (["--pos-emb", "xpos", "--layer-pattern", "xpos/bca*3,none/full", "--temperature-tuning-beta", 0.1],
                      "design"),
    "rnope_swa": (["--pos-emb", "rope", "--layer-pattern", "rope/sliding:{w}*3,none/full"], "design"),
    "gemma_5to1": (["--pos-emb", "rope", "--layer-pattern", "rope/sliding:{w}*5,rope/full", "--decoder-layers", 6], "design"),
    "irope": (["--pos-emb", "rope", "--layer-pattern", "rope/chunked:{w}*3,none/full", "--temperature-tuning-beta", 0.1],
              "design"),
    "rope_learned_sinks": (["--pos-emb", "rope", "--learned-sinks"], "design"),
    "xpos_sink_token": (["--pos-emb", "xpos", "--sink-token"], "design"),
    "rope_gate_headwise": (["--pos-emb", "rope", "--attention-gate", "headwise"], "design"),
    "rope_gate_elementwise": (["--pos-emb", "rope", "--attention-gate", "elementwise"], "design"),
    "rope_diff": (["--pos-emb", "rope", "--differential-attention"], "design"),
    # MoBA: blocks of l/8, each query its own and 2 chosen (3/8 of the context at l), in every layer or in the pattern's
    # global layer; at BCA's blocks (l/2) it trains as full attention and chooses blocks at longer contexts only
    "xpos_moba": (["--pos-emb", "xpos", "--moba-topk", 3, "--moba-block-size", "{b}"], "design"),
    "xpos_bca_nope_moba": (["--pos-emb", "xpos", "--layer-pattern", "xpos/bca*3,none/full", "--temperature-tuning-beta",
                            0.1, "--moba-topk", 3, "--moba-block-size", "{b}"], "design"),
    # the attention gate in the pattern's global layer only (elementwise, the paper's best)
    "xpos_bca_nope_gate": (["--pos-emb", "xpos", "--layer-pattern", "xpos/bca*3,none/full", "--temperature-tuning-beta",
                            0.1, "--attention-gate", "elementwise", "--attention-gate-layers", "global"], "design"),
    # the forgetting transformer's forget gate in every layer, without positions (the paper's FoX) and with RoPE
    "fox_nope": (["--pos-emb", "none", "--forget-gate"], "design"),
    "fox_rope": (["--pos-emb", "rope", "--forget-gate"], "design"),
    # landmark tokens after every l/8 tokens in the pattern's global layer: each query its own block and its 3 best
    # earlier landmarks' blocks (the paper's retrieval, kept at training so that every length sees the same structure)
    "xpos_bca_nope_landmark": (["--pos-emb", "xpos", "--layer-pattern", "xpos/bca*3,none/full",
                                "--temperature-tuning-beta", 0.1, "--landmark-block-size", "{b}", "--landmark-topk", 3],
                               "design"),
}
LOCAL_WINDOW_DIVISOR = 4  # the layer patterns' local window (sliding W, chunk C): l / 4
MOBA_BLOCK_DIVISOR = 8  # the MoBA runs' block ("{b}"): l / 8


def run_arguments(name: str, training_length: int) -> list:
    """The model options of run ``name`` (:data:`RUNS`) at training length l, a layer pattern's local window
    ("{w}") filled in as l / :data:`LOCAL_WINDOW_DIVISOR` and MoBA's block ("{b}") as l / :data:`MOBA_BLOCK_DIVISOR`.
    The role's own additions (randomized positions, DroPE's start) are the reproduction's."""
    fill = dict(w=training_length // LOCAL_WINDOW_DIVISOR, b=training_length // MOBA_BLOCK_DIVISOR)
    return [a.format(**fill) if isinstance(a, str) else a for a in RUNS[name][0]]


# the training flags of the designs whose global layers choose their own keys: MoBA's blocks, landmark tokens' groups
CHOOSES_KEYS = frozenset({"--moba-topk", "--landmark-block-size"})


def full_attention_only(run_args) -> bool:
    """Whether a run's global layers choose their own keys (:data:`CHOOSES_KEYS`: MoBA, landmark tokens), from its
    training flags (:func:`run_arguments`): evaluated under full attention only, since the executor refuses a bounded
    window there; so "reads the far context", whose denominator is a sliding window of l, is not measured for it."""
    return bool(CHOOSES_KEYS & set(map(str, run_args)))


DROPE_FRACTION = 0.12  # DroPE (arXiv 2512.12167) drops the positions for about the last 12% of the updates
# DroPE's recalibration at evaluation: every logit times beta = 1 + C ln(L / l) (--attention-temperature C). A DroPE run
# evaluates each C of this grid on the valid split at the longest length, then evaluates and probes again under the C
# with the lowest perplexity there (0: none, the plain evaluation's own numbers), its reports in WORK/runs/NAME/RECALIBRATED
DROPE_TEMPERATURES = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8)
RECALIBRATED = "recalibrated"
# what scripts/reproduce.py runs without --runs: the paper's runs; the trained designs are asked for by name
DEFAULT_RUNS = tuple(n for n, (_, role) in RUNS.items() if role in ("main", "ablation", "random"))
SINK_TOKENS = 4  # StreamingLLM's choice
# Evaluation-time methods run on the same checkpoints (METHOD_RUNS): name -> (--eval-windows, further
# fairseq-eval-lm arguments, the window it modifies (its reference row), rotary schemes only?).
METHODS: Dict[str, tuple] = {
    "bca_sinks": ("bca", ["--sink-tokens", SINK_TOKENS], "bca", False),
    "sliding_sinks": ("sliding", ["--sink-tokens", SINK_TOKENS], "sliding", False),
    "lm_infinite": ("lm_infinite", [], "sliding", False),
    "linear": ("full", ["--rope-scaling", "linear", "--rope-scaling-factor", "auto"], "full", True),
    "ntk": ("full", ["--rope-scaling", "ntk", "--rope-scaling-factor", "auto"], "full", True),
    "yarn": ("full", ["--rope-scaling", "yarn", "--rope-scaling-factor", "auto"], "full", True),
    # dynamic NTK at s = 1 is NTK-aware scaling with s = L / l (the ntk row): s = 2, transformers' usual setting
    "dynamic": ("full", ["--rope-scaling", "dynamic", "--rope-scaling-factor", 2], "full", True),
    "llama3": ("full", ["--rope-scaling", "llama3", "--rope-scaling-factor", "auto"], "full", True),
    "resonance": ("full", ["--rope-scaling", "resonance"], "full", True),
    # bounded-distance attention (every key visible, distances remapped), with and without log-n scaling
    "rerope": ("rerope", [], "full", False),
    "leaky_rerope": ("leaky_rerope", [], "full", True),
    "self_extend": ("self_extend", [], "full", False),
    "dca": ("dca", [], "full", False),
    "logn": ("full", ["--logn"], "full", False),
    "rerope_logn": ("rerope", ["--logn"], "full", False),
    "leaky_rerope_logn": ("leaky_rerope", ["--logn"], "full", True),
    "self_extend_logn": ("self_extend", ["--logn"], "full", False),
    "dca_logn": ("dca", ["--logn"], "full", False),
}
# every RoPE scaling with log-n as well (longrope needs a model's own factor lists: not run)
SCALINGS = ("linear", "ntk", "yarn", "dynamic", "llama3", "resonance")
METHODS.update({f"{m}_logn": (METHODS[m][0], [*METHODS[m][1], "--logn"], "full", True) for m in SCALINGS})
SCALED_PASSKEY = tuple(m for s in SCALINGS for m in (s, f"{s}_logn"))  # the methods passkey_finetuned_scaled probes
# the modes every probe compares (passkey, RULER-lite, LongPPL, BABILong-lite; and leaky_rerope on rotary runs only:
# its distances are fractional)
PROBE_WINDOWS = ("full", "bca", "sliding", "lm_infinite", "rerope", "self_extend", "dca")
# the passkey probe on each checkpoint; after fine-tuning on its format; the latter with log-n; and (rotary runs)
# at 8l under each of SCALINGS with the factor 8 (= auto at 8l), with and without log-n
# "ruler": RULER-lite after fine-tuning on its own format (lex ruler-data, RULER_FINETUNE), under PROBE_WINDOWS
# "longppl": LongPPL at LONGPPL_PROBE's lengths under PROBE_WINDOWS, the key tokens the checkpoint's own (full attention)
# "longppl_common": the same LongPPL on the key tokens of one common evaluator (LONGPPL_KEY_TOKENS, written by
# scripts/longppl_evaluator.py: RoPE trained at 16l), for l = 256 and the first 49,152 test tokens; not a default method
# "babilong": BABILong-lite after fine-tuning on its own format (lex babilong-data, BABILONG_FINETUNE), under PROBE_WINDOWS
PROBES = ("passkey", "passkey_finetuned", "passkey_finetuned_logn", "passkey_finetuned_scaled", "ruler", "longppl", "longppl_common",
          "babilong")
# Fine-tuning on the probe's own format (lex passkey-data): short prompts (at most l / 2 - 8 tokens with the key)
# make copying cheap to learn; the probe then asks how far beyond them, and beyond l, the skill carries.
PASSKEY_FINETUNE = {"samples": 10000, "updates": 600, "batch_size": 32, "lr": "2e-3"}
# RULER-lite's fine-tuning scores the loss on the answers alone (--answer-only-loss): with the loss over whole
# prompts (haystacks of 134-239 tokens around answers of 8-30), RoPE did not learn the format in 600 updates.
RULER_FINETUNE = {"samples": 10000, "updates": 600, "batch_size": 32, "lr": "2e-3", "answer_only_loss": True}
# where a run keeps them: other names than the whole-prompt recipe's (ruler_ft/, ruler.json), whose results are not reused
RULER_TUNED, RULER_REPORT = "ruler_ft_answers", "ruler_answers.json"
RULER_DATA_DONE = "train.answers.npy"  # lex ruler-data's last file: its rows and their answer lengths
RULER_PROBE = {"depths": "0.1,0.5,0.9", "trials": 4}
# LongPPL (Fang et al. 2025) at l, 4l and 16l. The paper's alpha = beta = 2 nats finds no key token in a 5M-parameter
# model at ppl 80-180 (RESULTS, "Does it use the far context?": 0 of 8,192 tokens on the 300-update xPos): a gain of
# more than 0.5 nats with a loss below 8 keeps 1-6% of the tokens.
LONGPPL_PROBE = {"multiples": (1, 4, 16), "alpha": 0.5, "beta": 8}
LONGPPL_REPORT = "longppl.json"
LONGPPL_COMMON_REPORT = "longppl_common.json"
LONGPPL_KEY_TOKENS = Path(__file__).resolve().parents[3] / "examples" / "lex_lm" / "designs_1000" / "longppl_evaluator.json"
# BABILong-lite: the one-, two- and three-fact tasks, fine-tuned as RULER-lite is (the answers' loss alone) on stories
# below l from the training split, then probed at l..16l on the test split
BABILONG_FINETUNE = {"tasks": "qa1,qa2,qa3", "samples": 8000, "updates": 600, "batch_size": 32, "lr": "2e-3",
                     "answer_only_loss": True}
BABILONG_PROBE = {"multiples": (1, 2, 4, 8, 16), "trials": 10}
BABILONG_TUNED, BABILONG_REPORT = "babilong_ft", "babilong.json"
BABILONG_DATA_DONE = "train.answers.npy"  # lex babilong-data's last file
# named settings of the whole reproduction (scripts/reproduce.py --profile NAME): option -> value, replacing the
# defaults of the options not given. "magnitudes" (the paper's magnitudes at CPU scale): a short training length
# evaluated to 64l, bf16 autocast training, snapshots at geometric budgets (3.1M, 6.1M, 12.3M and 24.6M training
# tokens: 4,096 a step, as the l = 256 recipe) so the trend with training shows; about 1.5 h of training per model on
# 2 cores (estimated from the l = 256 recipe's bf16 speed).
PROFILES: Dict[str, dict] = {
    "magnitudes": {"work": "work/magnitudes", "run_names": "rope,sinusoidal,xpos,alibi", "training_length": 64,
                   "longest": 64, "batch_size": 64, "max_update": 6000, "budgets": "750,1500,3000",
                   "bf16_autocast": True, "method_names": ""},
}
# the command-line flag of each PROFILES key that is not the option's own name
_FLAGS = {"run_names": "--runs", "method_names": "--methods"}


def profile_flags(name: str) -> str:
    """The command line a profile of :data:`PROFILES` stands for (``--runs rope,... --bf16-autocast ...``)."""
    out = []
    for key, value in PROFILES[name].items():
        flag = _FLAGS.get(key, "--" + key.replace("_", "-"))
        out.append(flag if value is True else f"{flag} ''" if value == "" else f"{flag} {value}")
    return " ".join(out)
METHOD_RUNS = ("xpos", "rope", "alibi")  # the checkpoints every method (and the passkey probe) runs on
ROTARY_RUNS = ("xpos", "rope")
LABELS = {
    "xpos": "LeX (xPos)", "rope": "RoPE (Roformer)", "alibi": "ALiBi", "sinusoidal": "Sinusoidal (absolute)",
    "sandwich": "Sandwich", "none": "NoPE", "xpos_no_rotation": "xPos without rotation (theta = 0)",
    "xpos_scalar_zeta": "xPos with one scalar zeta", "xpos_random": "LeX (xPos), random positions",
    "rope_random": "RoPE, random positions", "alibi_random": "ALiBi, random positions",
    "rope_qknorm": "RoPE + QK-norm", "rope_ssmax": "RoPE + SSMax", "none_tt": "NoPE + Llama 4 temperature tuning (0.1)",
    "rope_drope": "DroPE (RoPE + QK-norm, NoPE for the last 12%)",
    "xpos_bca_nope": "xPos BCA x3 + NoPE global, temperature tuning", "rnope_swa": "RNoPE-SWA (RoPE sliding x3 + NoPE global)",
    "gemma_5to1": "Gemma 5:1 (RoPE sliding x5 + global; 6 layers)",
    "irope": "iRoPE (RoPE chunked x3 + NoPE global, temperature tuning)",
    "rope_learned_sinks": "RoPE + learned sink logits (gpt-oss)",
    "xpos_sink_token": "xPos + a sink token at pre-training (StreamingLLM)",
    "rope_gate_headwise": "RoPE + gated attention, a gate per head (Qiu et al. 2025)",
    "rope_gate_elementwise": "RoPE + gated attention, a gate per element (Qiu et al. 2025)",
    "rope_diff": "RoPE + differential attention (Ye et al. 2025)",
    "xpos_moba": "xPos + MoBA (blocks of l/8, top 3)",
    "xpos_bca_nope_moba": "xPos BCA x3 + NoPE global with MoBA (blocks of l/8, top 3), temperature tuning",
    "xpos_bca_nope_gate": "xPos BCA x3 + NoPE global with an elementwise gate on it, temperature tuning",
    "fox_nope": "FoX: forget gate without positions (Lin et al. 2025)",
    "fox_rope": "RoPE + forget gate (FoX with positions)",
    "xpos_bca_nope_landmark": "xPos BCA x3 + NoPE global with landmark tokens (blocks of l/8, top 3), temperature tuning",
}
WINDOW_LABEL = {
    "full": "full attention", "bca": "BCA", "sliding": "sliding window (W = l)",
    "bca_sinks": f"BCA + {SINK_TOKENS} sinks", "sliding_sinks": f"sliding window + {SINK_TOKENS} sinks",
    "lm_infinite": "Λ-shaped (LM-Infinite)", "linear": "full + linear RoPE scaling (PI)",
    "ntk": "full + NTK-aware scaling", "yarn": "full + YaRN",
    "rerope": "ReRoPE (w = l/2)", "leaky_rerope": "Leaky ReRoPE (w = l/2, k = 16)", "self_extend": "Self-Extend (G = 8, w = l/4)",
    "dca": "DCA (s = 3l/4, w = l/16)", "logn": "full + log-n", "rerope_logn": "ReRoPE + log-n",
    "leaky_rerope_logn": "Leaky ReRoPE + log-n", "self_extend_logn": "Self-Extend + log-n", "dca_logn": "DCA + log-n",
    "dynamic": "full + dynamic NTK (s = 2)", "llama3": "full + Llama 3 scaling", "resonance": "full + Resonance RoPE",
}
WINDOW_LABEL.update({f"{m}_logn": f"{WINDOW_LABEL[m]} + log-n" for m in SCALINGS})


def methods_of(run: str, methods: Sequence[str]) -> List[str]:
    """Those of ``methods`` (names from :data:`METHODS` or :data:`PROBES`) that run on ``run``'s checkpoint:
    none unless ``run`` is one of :data:`METHOD_RUNS`; RoPE scaling (and its passkey probe) only on the rotary runs. A
    trained design (role "design" or "drope") takes the probes (:data:`PROBES`) but for the two that add log-n or a RoPE
    scaling to the design: it is probed as trained."""
    if run not in METHOD_RUNS:
        if RUNS.get(run, ((), ""))[1] in ("design", "drope"):
            return [m for m in methods if m in PROBES and m not in ("passkey_finetuned_logn", "passkey_finetuned_scaled")]
        return []
    rotary_only = {m for m, spec in METHODS.items() if spec[3]} | {"passkey_finetuned_scaled"}
    return [m for m in methods if m not in rotary_only or run in ROTARY_RUNS]


def is_design(role: str) -> bool:
    """Whether a run's role (:data:`RUNS`) is a trained design, whose fine-tuned passkey is also probed at 16l."""
    return role in ("design", "drope")


def drope_start(max_update: int) -> int:
    """The update from which a DroPE run trains without positions: the last :data:`DROPE_FRACTION` of ``max_update``."""
    return max_update - max(1, round(DROPE_FRACTION * max_update))
