# Two commands set everything up on a fresh machine:
#   make demo   shard the bundled dataset into a local S3, train 2 ranks, crash, resume, compare
#   make test   the whole test suite (what .ci/run runs)
# Both create or reuse .venv and install the pinned versions from constraints.txt.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: venv test test-fast demo bench bench-quick lint clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	touch $(STAMP)

venv: $(STAMP)

lint: $(STAMP)
	$(VENV)/bin/lint-imports

test: $(STAMP) lint
	$(PY) -m pytest -p no:cacheprovider --hypothesis-profile=ci

test-fast: $(STAMP)
	$(PY) -m pytest -p no:cacheprovider -m "not slow"

demo: $(STAMP)
	$(PY) -m streamio.train.demo

bench-deps: $(STAMP)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test,bench]'

bench: bench-deps
	$(PY) -m benchmarks.run

bench-quick: bench-deps
	$(PY) -m benchmarks.run --quick

clean:
	rm -rf $(VENV) build *.egg-info
