"""The verdict's cost figures measured in one process (experiments.design_costs): the cache each layer keeps, read from
the real caches, against positions counted from the run's options by hand; the base model of the run's depth; the
time ratios as the design's over the base's; a layer whose cache does neither is refused."""

import pytest

from lex_plugin.experiments.design_costs import CACHE_CONTEXT, _positions_at, measure_design_costs

L = 32  # training length: BCA blocks of 16, the layer patterns' windows and chunks of l / 4 = 8


# positions a layer holds between generation steps at 64k: a global layer every position; a bounded one its span less
# the key of the step that comes next (BCA l - 1, a sliding window or a chunk W - 1); a sink token one more in every layer
@pytest.mark.parametrize("run,design", [
    ("xpos_bca_nope", [L - 1] * 3 + [CACHE_CONTEXT]),
    ("rnope_swa", [L // 4 - 1] * 3 + [CACHE_CONTEXT]),
    ("gemma_5to1", [L // 4 - 1] * 5 + [CACHE_CONTEXT]),
    ("irope", [L // 4 - 1] * 3 + [CACHE_CONTEXT]),
    ("rope_ssmax", [CACHE_CONTEXT] * 4),
    ("xpos_sink_token", [CACHE_CONTEXT + 1] * 4),
    ("xpos_bca_nope_landmark", [L - 1] * 3 + [CACHE_CONTEXT + CACHE_CONTEXT // (L // 8)]),  # a landmark per l/8 tokens
])
def test_the_cache_is_read_from_each_layer_and_the_base_has_the_runs_depth(run, design):
    row = measure_design_costs(run, L, context=8 * L, repeats=1)
    assert row["kept"]["design"] == design
    assert row["kept"]["base"] == [CACHE_CONTEXT] * len(design)  # full attention at the run's depth (Gemma: 6 layers)
    assert row["cache_64k"] == sum(design) / (len(design) * CACHE_CONTEXT)
    assert row["eval_time"] == row["eval_s"]["design"] / row["eval_s"]["base"]
    assert row["gen_time"] == row["ms_per_token"]["design"] / row["ms_per_token"]["base"]
    assert (row["run"], row["base"], row["context"], row["training_length"]) == (run, f"full@base:{run}", 8 * L, L)


def test_a_layer_neither_global_nor_bounded_is_refused():
    assert _positions_at([100, 7], [110, 7], [110, 9], 10, 1000, 100) == [1000, 9]
    assert _positions_at([100, 7], [110, 12], [110, 14], 10, 1000, 100) == [1000, 14]  # a window at another phase
    with pytest.raises(RuntimeError, match="layer 1 held 40 positions at 100 and 12 after 10 more tokens"):
        _positions_at([100, 40], [110, 12], [110, 40], 10, 1000, 100)
    with pytest.raises(ValueError, match="must be above the training length"):
        measure_design_costs("irope", L, context=L)


def test_the_costs_table_writes_the_verdicts_ratios_as_the_verdict_does():
    """BENCHMARKS' cost table writes the two ratios the verdict judges as the verdict writes them, rounded half up
    (1.105 is "1.11x", str.format wrote "1.10x", which reads as cheap; 0.5005 is "0.501x", not "0.500x")."""
    from lex_plugin.experiments.benchmark_tables import design_costs_markdown

    row = {"run": "x", "eval_s": {"design": 2.21, "base": 2.0}, "eval_time": 1.105, "ms_per_token": {"design": 1.0, "base": 1.0},
           "gen_time": 1.0, "kept": {"design": [1001], "base": [2000]}, "cache_64k": 0.5005}
    assert "{:.2f}".format(1.105) == "1.10"
    text = design_costs_markdown([row])
    assert "| 1.11x |" in text and "| 0.501x |" in text
