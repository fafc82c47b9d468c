"""scripts/gpu_checks.py's sections that the prepared GPU call runs after Table 2 (scripts/gpu_call.sh), rehearsed on
the CPU at toy sizes: every row written, every equality within float32's reach of the float64 reference."""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO


@pytest.mark.e2e  # starts a process
def test_the_calls_checks_run_on_the_cpu_and_write_their_rows(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_checks.py"), "--out", str(tmp_path),
                           "--sections", "env,generation,equality", "--budget-s", "600"],
                          capture_output=True, text=True, cwd=REPO, env=dict(os.environ, OMP_NUM_THREADS="2"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "gpu_checks.json").read_text().splitlines()]
    assert not [r for r in rows if "error" in r or "skipped" in r], rows
    assert [r["section"] for r in rows if "done_s" in r] == ["env", "generation", "equality"]
    generation = [r for r in rows if r["section"] == "generation" and "done_s" not in r]
    assert len(generation) == 4 and all(r[f"ms_per_token_{p}"] > 0 for r in generation
                                        for p in ("products", "sdpa", "sdpa_flash"))
    steps = [r for r in rows if r["section"] == "equality" and "steps" in r]
    assert len(steps) == 6  # xPos, RoPE, ALiBi under BCA and full attention
    for r in steps:  # token by token on both step paths equals one parallel forward
        assert r["token_by_token_vs_parallel"] < 1e-4 and r["token_by_token_sdpa_flash_vs_parallel"] < 1e-4, r
    windows = [r for r in rows if r["section"] == "equality" and "gpu_fp32_vs_cpu_fp64" in r]
    assert len(windows) == 9 and all(r["gpu_fp32_vs_cpu_fp64"] < 1e-4 for r in windows)
