"""The cell journal of a long probe (lex ruler / lex babilong --json OUT): signed by the command, the checkpoint file
and every option, so that only a run of the same probe resumes from it; removed when the JSON is written."""

import json
import os
from pathlib import Path

import click
from click.testing import CliRunner

from conftest import TRAIN_LEN
from lex_plugin.cli.common import JSON_OUT, RESUME, probe_journal
from lex_plugin.evaluation import journal as journal_module


@click.command("probe")
@click.option("--path", "checkpoint", type=click.Path(path_type=Path))
@click.option("--trials", type=int, default=1)
@JSON_OUT
@RESUME
def _probe(checkpoint, trials, json_out, resume):
    journal = probe_journal(json_out, checkpoint, resume)
    if journal is None:
        click.echo("none")
        return
    click.echo(f"finished {len(journal)}")
    journal.put(["cell", len(journal)], [{"trials": trials}])


def test_only_the_same_command_on_the_same_checkpoint_file_and_code_resumes(tmp_path, monkeypatch):
    ckpt, out = tmp_path / "checkpoint_last.pt", tmp_path / "out.json"
    ckpt.write_bytes(b"weights")
    run = lambda *extra: CliRunner().invoke(_probe, ["--path", str(ckpt), "--json", str(out), *extra]).output.strip()  # noqa: E731
    assert run() == "finished 0"
    assert run() == "finished 1"  # the same command: the cell of the first run is read back
    assert run("--trials", "2") == "finished 0"  # another option: afresh
    assert run("--trials", "2") == "finished 1"
    stat = ckpt.stat()
    os.utime(ckpt, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # the checkpoint written again (a new fine-tuning)
    assert run("--trials", "2") == "finished 0"
    assert run("--trials", "2") == "finished 1"
    monkeypatch.setattr(journal_module, "code_identity", lambda: "another version")  # lex_plugin edited in between
    assert run("--trials", "2") == "finished 0"
    assert run("--trials", "2", "--no-resume") == "none" and not (tmp_path / "out.json.cells.jsonl").exists()
    assert CliRunner().invoke(_probe, ["--path", str(ckpt)]).output.strip() == "none"  # no --json: nothing to resume


def test_the_code_digest_follows_every_python_file_of_the_package_and_nothing_else(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    first = journal_module.code_identity(tmp_path)
    assert journal_module.code_identity(tmp_path) == first and len(first) == 16
    (tmp_path / "notes.md").write_text("not code")
    assert journal_module.code_identity(tmp_path) == first
    (tmp_path / "sub" / "b.py").write_text("y = 3\n")
    assert journal_module.code_identity(tmp_path) != first
    (tmp_path / "sub" / "b.py").write_text("y = 2\n")
    (tmp_path / "sub" / "b.py").rename(tmp_path / "sub" / "c.py")  # same bytes, another module
    assert journal_module.code_identity(tmp_path) != first
    assert journal_module.code_identity() == journal_module.code_identity(Path(journal_module.__file__).parents[1])


def test_lex_babilong_killed_then_run_again_asks_only_the_unfinished_cell(trained, data_bin, tmp_path, monkeypatch):
    """lex babilong killed within its second cell leaves a journal and no JSON; the same command again asks the
    second cell's stories alone, writes the JSON an uninterrupted run (--no-resume) writes, and removes the
    journal."""
    from lex_plugin.cli import main
    from lex_plugin.evaluation import babilong

    ckpt, _ = trained
    out = tmp_path / "babilong.json"
    journal = out.with_name(out.name + ".cells.jsonl")
    args = ["babilong", str(data_bin), "--path", str(ckpt), "--tasks", "qa1", "--lengths", f"{2 * TRAIN_LEN},{4 * TRAIN_LEN}",
            "--windows", "full", "--trials", "2", "--json", str(out)]
    asked, kill_after, real = [], [3], babilong.score_candidates

    def counted(*a, **kw):
        asked.append(1)
        if kill_after[0] is not None and len(asked) >= kill_after[0]:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(babilong, "score_candidates", counted)
    killed = CliRunner().invoke(main, args)
    assert killed.exit_code != 0 and journal.exists() and not out.exists()
    asked.clear()
    kill_after[0] = None
    assert CliRunner().invoke(main, args).exit_code == 0
    assert len(asked) == 2 and not journal.exists()  # the second cell's two stories
    resumed = json.loads(out.read_text())["results"]
    assert CliRunner().invoke(main, args + ["--no-resume"]).exit_code == 0
    assert len(asked) == 2 + 4 and resumed == json.loads(out.read_text())["results"]
