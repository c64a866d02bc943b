# The two commands the README promises, `make run` and `make test`, and the pieces of the
# latter on their own: `make lint`, `make typecheck`, `make unit`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
TOOLS := .cache/tools
PYDIRS := app wal sink tests soak scripts

# run.yaml's settings on one line: "wal.barrier_secs: 5, sink.flush_age_secs: 2".
RUN_CADENCES = awk '/^[a-z]/ {s = substr($$1, 1, length($$1) - 1)} \
	/^ +[a-z_]+:/ {printf "%s%s.%s %s", (n++ ? ", " : ""), s, $$1, $$2} END {print ""}' run.yaml

.PHONY: run test lint typecheck unit bench soak soak-long fuzz clean

# What the node itself needs (`make run`): its dependencies and nothing of the test
# toolchain, with pip's progress shown. The install compiles the native decoder; the
# venv gets the setuptools pyproject.toml builds with, for the in-place rebuild below.
$(VENV)/.installed-run: pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip 'setuptools>=77' wheel
	$(PY) -m pip install -e . --config-settings editable_mode=compat
	touch $@

# Everything the tests, the soak and the benchmarks need on top of it.
$(VENV)/.installed: $(VENV)/.installed-run
	$(PY) -m pip install -q -e '.[test,soak]' --config-settings editable_mode=compat
	touch $@

# The native decoder (app/receive/_otlpdecode.c): the install compiles it in place; an
# edited C file is compiled again before anything runs.
NATIVE := $(VENV)/.native
$(NATIVE): app/receive/_otlpdecode.c app/ingest/mining/_minefast.c setup.py $(VENV)/.installed-run
	$(PY) setup.py -q build_ext --inplace
	touch $@

# A trial on one machine: the embedded default (./data and the local object store) with
# run.yaml's short cadences, printed first, so what is sent is queryable within seconds.
run: $(VENV)/.installed-run $(NATIVE)
	@echo "make run: run.yaml's trial cadences: $$($(RUN_CADENCES)) (production defaults: 300 s)"
	$(VENV)/bin/ourios serve --config run.yaml

# Installs everything the tests need, then runs lint, type checks, the generated-docs checks
# and the whole suite (pytest prints the 25 slowest tests: addopts in pyproject.toml).
test: $(VENV)/.installed $(NATIVE)
	scripts/install-test-tools.sh $(TOOLS)
	$(MAKE) --no-print-directory lint typecheck
	$(PY) scripts/gen_config_doc.py --check
	$(PY) scripts/gen_chart_schema.py --check
	PATH="$(CURDIR)/$(TOOLS)/bin:$(CURDIR)/$(VENV)/bin:$$PATH" $(VENV)/bin/pytest -q -p no:cacheprovider

# ruff's rules and its formatting, on every Python file of the tree (.pre-commit-config.yaml
# runs the same two).
lint: $(VENV)/.installed
	$(VENV)/bin/ruff check $(PYDIRS)
	$(VENV)/bin/ruff format --check $(PYDIRS)

# mypy --strict (pyproject.toml) on every Python file of the tree; a bare `mypy` checks the
# same directories (`files` in pyproject.toml).
typecheck: $(VENV)/.installed
	$(VENV)/bin/mypy $(PYDIRS)

# The unit tests alone: no subprocesses, no SeaweedFS, seconds rather than minutes.
unit: $(VENV)/.installed $(NATIVE)
	$(VENV)/bin/pytest -q -p no:cacheprovider tests/unit

# The benchmarks (not part of `make test`): each prints its figure beside a reference
# measured in the same run; record the results in docs/BENCHMARKS.md.
bench: $(VENV)/.installed $(NATIVE)
	$(PY) soak/bench/wal_append.py
	$(PY) soak/bench/housekeeping.py
	$(PY) soak/bench/ingest.py
	$(PY) soak/bench/barrier.py
	$(PY) soak/bench/restart.py

# The soak (docs/SOAK.md): SeaweedFS, ourios serve, locust, SIGKILLs, verify, report in
# soak/out/<time>/. Not part of `make test` (which runs a two-minute one). SOAK_ARGS adds
# options, e.g. make soak SOAK_ARGS="--rate 40 --tenants 64".
soak: $(VENV)/.installed
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m soak run --duration 10m --kill-every 60s $(SOAK_ARGS)

# The long soak whose last result docs/SOAK.md records: an hour, a kill every minute.
soak-long: $(VENV)/.installed
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m soak run --duration 60m --kill-every 60s $(SOAK_ARGS)

# The native decoder's and the native miner's differential tests at length (FUZZ_EXAMPLES
# cases a property, fresh ones each run), then the corpus `make test` runs and SAN_EXAMPLES
# more a property
# against a build with AddressSanitizer and UndefinedBehaviorSanitizer
# (scripts/sanitize_native.py; docs/BENCHMARKS.md records the last result).
FUZZ_EXAMPLES ?= 10000
SAN_EXAMPLES ?= 3000
fuzz: $(VENV)/.installed $(NATIVE)
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_CASES_FILE=$(CURDIR)/.fuzz-cases.json \
		$(VENV)/bin/pytest -q -p no:cacheprovider tests/unit/app/receive/test_native.py
	@cat .fuzz-cases.json; echo
	FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FUZZ_CASES_FILE=$(CURDIR)/.fuzz-cases.json \
		$(VENV)/bin/pytest -q -p no:cacheprovider tests/unit/app/ingest/mining/test_native_miner.py
	@cat .fuzz-cases.json; echo
	$(PY) scripts/sanitize_native.py --examples $(SAN_EXAMPLES)
	$(PY) scripts/sanitize_native.py --target miner --examples $(SAN_EXAMPLES)

clean:
	rm -rf $(VENV) .cache .mypy_cache .ruff_cache build .fuzz-cases.json
	rm -f app/receive/_otlpdecode*.so app/ingest/mining/_minefast*.so
