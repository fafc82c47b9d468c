"""The suite's two tiers (conftest.py): a test that asks for a preparing or training fixture is marked e2e, and in the
fast tier a test that is not refuses to start a process (git, for a report's provenance, excepted)."""

import subprocess
import sys
from types import SimpleNamespace

import pytest

import conftest


def test_a_test_asking_for_a_trained_fixture_is_end_to_end():
    items = [SimpleNamespace(fixturenames=names, markers=[]) for names in (["tmp_path", "trained"], ["hub"], ["tmp_path"])]
    for item in items:
        item.add_marker = item.markers.append
    conftest.pytest_collection_modifyitems(None, items)
    assert [[m.name for m in item.markers] for item in items] == [["e2e"], ["e2e"], []]
    assert {"data_bin", "trained", "hub", "filler", "real_batches", "pg_slice"} <= conftest.E2E_FIXTURES


def test_the_fast_tier_refuses_a_process_but_git():
    with pytest.raises(AssertionError, match="mark the test @pytest.mark.e2e"):
        conftest._NoProcess([sys.executable, "-c", "pass"])
    proc = conftest._NoProcess(["git", "--version"], stdout=subprocess.PIPE)
    assert proc.wait() == 0
