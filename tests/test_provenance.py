"""A report's provenance (lex_plugin.provenance): the checkout's commit and whether it is dirty, read from git against
git itself; "unknown" outside a checkout, never a guess; the device in words; every field a report records."""

import re
import subprocess
import sys

from conftest import REPO

from lex_plugin.provenance import UNKNOWN, code_commit, device_name, provenance


def test_the_commit_is_gits_own_and_unknown_outside_a_checkout(tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    assert code_commit() == {"commit": head, "dirty": bool(status)} and re.fullmatch(r"[0-9a-f]{40}", head)
    assert code_commit(tmp_path) == {"commit": UNKNOWN, "dirty": UNKNOWN}


def test_a_report_records_command_device_versions_seed_and_wall_time():
    import torch

    record = provenance(["lex", "passkey", "--path", "a b.pt"], seed=3, wall_s=12.345, cuda=False)
    assert set(record) == {"command", "commit", "dirty", "device", "threads", "torch", "python", "seed", "date",
                           "wall_s"}
    assert record["threads"] == torch.get_num_threads()
    assert record["command"] == "lex passkey --path 'a b.pt'" and record["seed"] == 3 and record["wall_s"] == 12.3
    assert record["torch"] == torch.__version__ and record["python"] == sys.version.split()[0]
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["date"])
    assert record["device"] == device_name(False) and re.search(r", \d+ cores$", record["device"])
    assert provenance([], cuda=False)["wall_s"] is None


def test_a_provenance_line_says_which_fields_nothing_recorded():
    """The line under a generated table: known fields as recorded, an "unknown" one said to be unrecorded (it read
    "on unknown, ... unknown s" before)."""
    from lex_plugin.experiments.benchmark_tables import provenance_line

    known = {"date": "2026-12-01", "device": "AMD EPYC, 2 cores", "torch": "2.13.0+cpu", "commit": "0123456789abcdef",
             "dirty": True, "wall_s": 81.4, "command": "lex passkey x"}
    assert provenance_line(known) == ("Measured 2026-12-01 on AMD EPYC, 2 cores, torch 2.13.0+cpu, commit 0123456789 "
                                      "(uncommitted changes), 81.4 s: `lex passkey x`.")
    unknown = dict(known, **{k: UNKNOWN for k in ("device", "torch", "commit", "dirty", "wall_s", "command")})
    assert provenance_line(unknown) == ("Measured 2026-12-01 on an unrecorded device, torch unrecorded, commit "
                                        "unrecorded, wall time unrecorded: command unrecorded.")
    assert provenance_line(dict(unknown, date=UNKNOWN)).startswith("Measured at an unrecorded date on an unrecorded device")
