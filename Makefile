# One-command setup: every target builds the virtualenv first (idempotent, pinned versions).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test test-docker check lint docs docs-check docs-site docs-serve clean

install: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The main job: BSP under a changing heterogeneity level, uniform vs dynamic batching.
demo: $(STAMP)
	$(VENV)/bin/omnilearn run --config configs/demo.yaml --compare --out runs/demo

# Everything, the Docker suite included when a daemon answers or can be started (root + apt).
test: $(STAMP)
	bash scripts/install_test_tools.sh
	$(PY) -m pytest -q tests

# Only the Docker integration suite; a missing daemon is a failure here, not a skip.
test-docker: $(STAMP)
	OMNILEARN_REQUIRE_DOCKER=1 $(PY) -m pytest -q -m docker tests

# The quick unit tier (under 3 minutes): no training runs, no Docker.
check: $(STAMP)
	$(PY) -m pytest -q tests/unit

# The generated references, docs/reference/config.md and cli.md, from the config dataclasses and the
# argument parser; tests/unit/test_docs_reference.py fails when the committed files differ.
docs: $(STAMP)
	$(PY) -m omnilearn.docs_gen

docs-check: $(STAMP)
	$(PY) -m omnilearn.docs_gen --check

# The Markdown as a site (mkdocs, material theme; pins in docs/requirements.txt, installed on demand).
docs-site: docs
	$(PY) -m pip install --quiet -r docs/requirements.txt
	MKDOCS=$(VENV)/bin/mkdocs scripts/docs_site.sh build

docs-serve: docs
	$(PY) -m pip install --quiet -r docs/requirements.txt
	MKDOCS=$(VENV)/bin/mkdocs scripts/docs_site.sh serve

lint: $(STAMP)
	$(VENV)/bin/ruff check pytorch tests

clean:
	rm -rf runs .pytest_cache build site
