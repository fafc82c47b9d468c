"""LongPPL of ``lex score --longppl`` against the authors' package (``pip install --no-deps longppl``) on one
document, through the checkpoint's Hugging Face export.

    python scripts/crosscheck_longppl.py --path checkpoints/xpos/checkpoint_last.pt --data data-bin/pg DOC.txt

The package's ``compute_longppl`` runs the export (``AutoModelForCausalLM``, trust_remote_code) as both the
evaluator and the evaluated model under full attention, with ``trunc_len`` = K and ``sliding_window`` = S of
``lex score``'s rule and its ``beta = -beta``. It maps key tokens between the two tokenizers through character
offsets, which the export's slow tokenizer (Moses + SentencePiece) does not give; the tokenizer handed to the
package therefore gives each token of ``lex score``'s encoding a span of its own (``</s>`` first, an empty
span), so that the comparison is of token positions, the thing both sides decide. Prints both sides and
exits 1 when the key tokens differ or LongPPL differs by more than 1e-4 (relative). (The package fails on a
document whose last truncated window holds one token; the script then drops the document's last token on both
sides.)
"""

import argparse
import math
import sys
import tempfile
from pathlib import Path

import torch


class _PositionTokenizer:
    """The package's tokenizer interface over fixed ids: ``[</s>] + ids``, token i (i >= 1) at span (i - 1, i)."""

    def __init__(self, ids, eos):
        self.ids = [eos] + [int(t) for t in ids]

    def __call__(self, text, return_tensors="pt", add_special_tokens=True, return_offsets_mapping=False):
        out = {"input_ids": torch.tensor([self.ids])}
        if return_offsets_mapping:
            out["offset_mapping"] = torch.tensor([[(0, 0)] + [(i, i + 1) for i in range(len(self.ids) - 1)]])
        return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("document", type=Path)
    parser.add_argument("--path", type=Path, required=True, help="lex_lm checkpoint")
    parser.add_argument("--data", type=Path, required=True, help="its data-bin")
    parser.add_argument("--alpha", type=float, default=2.0)
    parser.add_argument("--beta", type=float, default=2.0)
    parser.add_argument("--trunc-len", type=int, default=None, help="K (default 3l/4)")
    parser.add_argument("--sliding-window", type=int, default=None, help="S (default l/4)")
    args = parser.parse_args(argv)

    from longppl.longppl import compute_longppl, find_key_token
    from transformers import AutoModelForCausalLM

    from lex_plugin.evaluation.documents import encode_document, score_tokens
    from lex_plugin.evaluation.longppl import KeyTokenRule, document_key_tokens
    from lex_plugin.export.hf import export_hf
    from lex_plugin.hub_interface import from_pretrained

    text = args.document.read_text(encoding="utf-8")
    hub = from_pretrained(args.path.parent, args.path.name, args.data)
    rule = KeyTokenRule(args.alpha, args.beta, args.trunc_len, args.sliding_window).resolve(hub.training_length)
    tokens = encode_document(hub, text)
    if (tokens.numel() + 1 - rule.trunc_len) % rule.sliding_window == 1:
        tokens = tokens[:-1]  # the package fails on a last window of one token (a 0-d tensor after squeeze())
    eos, pad = hub.src_dict.eos(), hub.src_dict.pad()
    key = document_key_tokens(hub.models[0], tokens, eos, pad, rule)
    ours = score_tokens(hub.models[0], tokens, hub.spec, eos, args.document.name, hub.training_length, key_tokens=key)
    our_keys = key.nonzero()[:, 0]

    with tempfile.TemporaryDirectory() as tmp:
        export_hf(args.path, args.data, Path(tmp) / "export")
        model = AutoModelForCausalLM.from_pretrained(Path(tmp) / "export", trust_remote_code=True).eval()
        tok = _PositionTokenizer(tokens, hub.src_dict.eos())
        spans = find_key_token(text, model, tok, rule.trunc_len, rule.sliding_window, alpha=rule.alpha, beta=-rule.beta)
        theirs = compute_longppl(text, model, model, tok, tok, trunc_len=rule.trunc_len,
                                 sliding_window=rule.sliding_window, alpha=rule.alpha, beta=-rule.beta)
    their_keys = torch.tensor(sorted({int(p) for a, b in spans.tolist() for p in range(a, b)}), dtype=torch.long)
    same_keys = torch.equal(our_keys, their_keys) and (theirs["n_key_token"] or 0) == our_keys.numel()
    close = theirs["longppl"] is not None and math.isclose(ours.longppl, float(theirs["longppl"]), rel_tol=1e-4)
    print(f"document {args.document.name}: {tokens.numel():,} tokens, l = {hub.training_length}, K = {rule.trunc_len}, "
          f"S = {rule.sliding_window}, alpha = {rule.alpha}, beta = {rule.beta} nats")
    print("| side | key tokens | LongPPL | ppl |\n|---|---|---|---|")
    print(f"| lex score --longppl | {ours.key_tokens:,} | {ours.longppl:.6f} | {ours.ppl:.6f} |")
    their_longppl = math.nan if theirs["longppl"] is None else float(theirs["longppl"])
    print(f"| longppl package (compute_longppl) | {theirs['n_key_token'] or 0:,} | {their_longppl:.6f} | {float(theirs['ppl']):.6f} |")
    print(f"same key tokens: {same_keys}; LongPPL within 1e-4: {close}")
    return 0 if same_keys and close else 1


if __name__ == "__main__":
    sys.exit(main())
