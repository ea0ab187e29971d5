# Two commands set everything up on a fresh machine:
#   make demo   shard the bundled dataset into a local S3, train 2 ranks, crash, resume, compare
#   make test   the whole test suite (what .ci/run runs)
# Both create or reuse .venv and install the pinned versions from constraints.txt.
# `make docs` builds the documentation site into build/docs (mkdocs --strict: any warning fails).

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test test-fast demo bench bench-quick lint docs clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@# the distribution was called "streamio" before 0.2.0 (now streamio-torch): drop a stale install
	$(PY) -m pip uninstall --quiet --yes streamio 2>/dev/null || true
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,bench,docs]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check streamio cli tests benchmarks scripts examples docs/api
	$(PY) scripts/check_sizes.py streamio cli

# Two pytest workers, each a whole test file at a time (module fixtures launch their processes
# once); TEST_WORKERS=0 runs the suite in one process.
TEST_WORKERS ?= 2

test: $(STAMP) lint
	$(PY) -m pytest -p no:cacheprovider --hypothesis-profile=ci -n $(TEST_WORKERS) --dist loadfile

test-fast: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider -m "not slow"

demo: $(STAMP)
	$(PY) -m streamio.train.demo

# The API reference is generated from the docstrings (mkdocstrings); CI builds it too (tests/docs).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir build/docs

# The test environment includes the bench extra: CI runs a quick benchmark so they cannot rot.
bench: $(STAMP)
	$(PY) -m benchmarks.run --peers mosaicml,litdata

bench-quick: $(STAMP)
	$(PY) -m benchmarks.run --quick

clean:
	rm -rf $(VENV) build *.egg-info
