# One-command setup: every target builds the virtualenv first (idempotent, pinned versions).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo check test test-docker docker lint docs docs-check docs-site docs-serve clean

install: $(STAMP)

$(STAMP): requirements.lock pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements.lock
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# The main job: BSP under a changing heterogeneity level, uniform vs dynamic batching.
demo: $(STAMP)
	$(VENV)/bin/omnilearn run --config configs/demo.yaml --compare --out runs/demo

# The quick loop: the unit tier (no process, root, Docker, network or sleep), under 3 minutes.
check: $(STAMP)
	$(PY) -m pytest -q --hypothesis-profile=quick tests/unit

# Everything: unit, integration (root-only ones skip with the reason elsewhere) and Docker tiers,
# with a daemon started first; the 20 slowest tests are printed at the end.
test: $(STAMP) docker
	bash scripts/install_test_tools.sh
	$(PY) -m pytest -q --durations=20 tests

# Only the Docker tier; a missing daemon is a failure here, not a skip.
test-docker: $(STAMP) docker
	OMNILEARN_REQUIRE_DOCKER=1 $(PY) -m pytest -q --durations=20 tests/docker

# A Docker daemon in a single-node swarm for the Docker tier: ./docker_install.sh --swarm where this
# host allows it (root on Debian/Ubuntu); elsewhere a daemon must already answer, or that tier is skipped.
docker: $(STAMP)
	@if $(PY) -c 'from omnilearn.emulator.backends.dockerd import daemon_client; daemon_client(timeout=10)' 2>/dev/null; then \
		echo "docker: a daemon answers"; \
	elif [ "$$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1; then \
		bash docker_install.sh --swarm; \
	else \
		echo "docker: no daemon answers and none can be installed here (needs root on Debian/Ubuntu): the Docker tier is skipped" >&2; \
	fi

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
	$(VENV)/bin/ruff check pytorch tests examples

clean:
	rm -rf runs .pytest_cache build site
