"""The demo's report (scripts/demo_report.py, run last by scripts/demo.sh): fairseq-eval-lm's own figures and the
command that printed them read from its output, validation perplexity and throughput from fairseq-train's log, the
step times and the provenance; and the walkthrough's "Measured" block generated from the committed report."""

import json
import sys

import pytest

from conftest import _script
from lex_plugin.experiments.demo_report import demo_report, read_eval_lm_log

# fairseq-eval-lm 0.12's own lines (fairseq_cli/eval_lm.py's format strings), after the command scripts/demo.sh prints
EVAL = ["+ fairseq-eval-lm work/demo/data-bin --user-dir lex_plugin --task lex_language_modeling --tokens-per-sample 256",
        "2026-12-01 23:40:00 | INFO | fairseq_cli.eval_lm | Evaluated 827,705 tokens in 121.4s (6817.99 tokens/s)",
        "2026-12-01 23:40:00 | INFO | fairseq_cli.eval_lm | Loss (base 2): 6.9861, Perplexity: 126.78"]
TRAIN = ["epoch 001:    100 / 1922 loss=9.1, ppl=549, wps=3000, ups=0.7, wpb=4096, bsz=16, num_updates=100, lr=0.001",
         "epoch 001:    200 / 1922 loss=8.1, ppl=274, wps=3400, ups=0.8, wpb=4096, bsz=16, num_updates=200, lr=0.001",
         "epoch 001 | valid on 'valid' subset | loss 7.77 | ppl 218.2 | wps 9000 | wpb 4096 | bsz 16 | num_updates 200"]


def test_fairseqs_figures_and_the_command_are_read_from_its_output():
    assert read_eval_lm_log("\n".join(EVAL)) == {"command": EVAL[0][2:], "tokens": 827705, "seconds": 121.4,
                                                 "loss_bits": 6.9861, "ppl": 126.78}
    assert read_eval_lm_log("\n".join(EVAL[1:]))["command"] == "unknown"
    with pytest.raises(ValueError, match="not --length-report-only"):
        read_eval_lm_log(EVAL[0] + "\n" + EVAL[1])


def test_the_report_holds_the_steps_the_curve_and_fairseqs_figures(tmp_path, monkeypatch, capsys):
    (tmp_path / "train.log").write_text("\n".join(TRAIN) + "\n")
    (tmp_path / "eval.log").write_text("\n".join(EVAL) + "\n")
    report = demo_report(tmp_path / "train.log", {"prepare": 61, "train": 905.2, "evaluate": 290},
                         {"test": tmp_path / "eval.log"}, argv=["scripts/demo_report.py"])
    assert report["steps"] == {"prepare": 61, "train": 905.2, "evaluate": 290} and report["updates"] == 200
    assert report["train_tokens_per_s"] == 3200 and report["valid"] == {"200": {"loss": 7.77, "ppl": 218.2}}
    assert report["eval_lm"]["test"]["ppl"] == 126.78
    assert report["provenance"]["wall_s"] == 1256.2 and report["provenance"]["command"] == "scripts/demo_report.py"
    with pytest.raises(ValueError, match="give seconds >= 0"):
        demo_report(tmp_path / "train.log", {"train": -1}, {})
    # the script, as scripts/demo.sh runs it (its main() in this process: the fast tier starts no process)
    main = _script("demo_report.py").main
    out = tmp_path / "demo_report.json"
    monkeypatch.setattr(sys, "argv", ["demo_report.py", str(tmp_path / "train.log"), "--step", "prepare=61", "--step",
                                      "train=905", "--eval-log", f"test={tmp_path / 'eval.log'}", "-o", str(out)])
    main()
    printed = capsys.readouterr().out
    assert json.loads(out.read_text())["steps"] == {"prepare": 61.0, "train": 905.0}
    assert "| **make demo** | **16 min 6 s** |" in printed and "perplexity 126.78" in printed
    monkeypatch.setattr(sys, "argv", ["demo_report.py", str(tmp_path / "train.log"), "--step", "train", "-o", str(out)])
    with pytest.raises(SystemExit) as exit_:
        main()
    assert exit_.value.code == 2 and "give NAME=VALUE" in capsys.readouterr().err
