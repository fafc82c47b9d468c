"""Every lex command that runs a model puts it on CUDA where CUDA is available, unless --cpu is given (fairseq's
convention). This machine has no GPU: CUDA is reported present, and the hub's move to a device is recorded and ends
the command at once (the probes' tensors follow the model's device; the GPU runs check them there)."""

import pytest
import torch
from click.testing import CliRunner

from lex_plugin.cli import main
from lex_plugin.hub_interface import LexHubInterface


class Moved(Exception):
    """Raised where the hub is moved: the command went through the device choice."""


@pytest.fixture
def moves(monkeypatch):
    """The devices hubs are moved to, in order; the ``stop_at``-th move (1-based) raises :class:`Moved`."""
    record = {"devices": [], "stop_at": 1}

    def to(self, device):
        record["devices"].append(torch.device(device).type)
        if len(record["devices"]) >= record["stop_at"]:
            raise Moved()
        return self

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(LexHubInterface, "to", to)
    return record


def command(name, ckpt, data, tmp_path):
    doc = tmp_path / "doc.txt"
    doc.write_text("The night was dark and the road was long. " * 20)
    return {
        "generate": ["generate", data, "--path", ckpt, "--prompt", "The night", "--max-len", "3"],
        "score": ["score", "--path", ckpt, data, doc],
        "passkey": ["passkey", "--path", ckpt, data, "--lengths", "128", "--depths", "0.5", "--trials", "1"],
        "ruler": ["ruler", "--path", ckpt, data, "--lengths", "128", "--tasks", "niah_single_1"],
        "babilong": ["babilong", "--path", ckpt, data, "--lengths", "128", "--tasks", "qa1"],
        "resolution": ["resolution", "--path", ckpt, data, "--lengths", "64"],
        "receptive-field": ["receptive-field", "--path", ckpt, data, "--length", "64"],
    }[name]


@pytest.mark.parametrize("name", ["generate", "score", "passkey", "ruler", "babilong", "resolution", "receptive-field"])
def test_each_command_runs_on_cuda_unless_cpu_is_given(name, moves, trained, data_bin, tmp_path):
    ckpt, _ = trained
    args = [str(a) for a in command(name, ckpt, data_bin, tmp_path)]
    for extra, device in (([], "cuda"), (["--cpu"], "cpu")):
        moves["devices"].clear()
        result = CliRunner().invoke(main, args + extra)
        assert isinstance(result.exception, Moved), result.output
        assert moves["devices"] == [device]


def test_longppls_evaluator_follows_the_scored_model(moves, trained, data_bin, tmp_path):
    """``lex score --longppl --key-token-model``: the evaluator is loaded second, on the same device."""
    ckpt, _ = trained
    moves["stop_at"] = 2
    args = [str(a) for a in command("score", ckpt, data_bin, tmp_path)] + ["--longppl", "--key-token-model", str(ckpt)]
    for extra, device in (([], "cuda"), (["--cpu"], "cpu")):
        moves["devices"].clear()
        result = CliRunner().invoke(main, args + extra)
        assert isinstance(result.exception, Moved), result.output
        assert moves["devices"] == [device, device]


def test_without_cuda_every_command_stays_on_the_cpu(monkeypatch):
    from lex_plugin.cli.common import command_device

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert command_device({}) == torch.device("cpu") == command_device({"cpu": False})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert command_device({"cpu": False}) == torch.device("cuda") and command_device({"cpu": True}).type == "cpu"
