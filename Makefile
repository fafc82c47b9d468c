# One set-up path for both README commands: `make install` builds .venv once (idempotent).
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.lex-installed

.PHONY: install test test-fast demo reproduce bench clean-venv

install: $(STAMP)

$(STAMP): setup.py scripts/install.sh
	VENV=$(VENV) bash scripts/install.sh
	touch $(STAMP)

# README command 2: the test suite (its count and measured times: README.md).
# Two workers (pytest-xdist), one thread each: one thread per worker keeps the two from oversubscribing the cores.
# The tests run `lex` commands, fairseq-train, fairseq-eval-lm and scripts/reproduce.py (--in-process) inside the test
# process (conftest.run_cli): no new interpreter per command.
test: install
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist worksteal tests $(PYTEST_ARGS)

# The fast tier: the tests that prepare no data, train nothing and start no process (count and time: README.md).
# tests/conftest.py marks a test that asks for a trained fixture e2e; any other that starts a process fails here,
# naming the marker it needs.
test-fast: install
	LEX_TEST_TIER=fast OMP_NUM_THREADS=1 $(PY) -m pytest -q -n 2 --dist worksteal -m "not e2e" tests $(PYTEST_ARGS)

# README command 1: prepare the books, train lex_lm_tiny, evaluate (20 min 8 s on 2 cores on 2026-12-01: examples/lex_lm/demo_report.json).
demo: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH bash scripts/demo.sh

# The papers' tables at CPU scale: every scheme, l = 256, full / sliding / BCA, resolution (examples/lex_lm/RESULTS.md).
reproduce: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) scripts/reproduce.py $(REPRODUCE_ARGS)

# Training throughput of lex_lm_tiny vs stock transformer_lm of the same size (examples/lex_lm/BENCHMARKS.md).
bench: install
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(PY) scripts/bench_train_speed.py

clean-venv:
	rm -rf $(VENV)
