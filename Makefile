# The two contracts: `make demo` and `make test`. Both set everything up first.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/install-system-deps.sh
	bash scripts/install-system-deps.sh
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,spark]'
	touch $(STAMP)

demo: setup
	$(PY) -m ottla.demo

test: setup
	$(PY) -m pytest

bench: setup
	$(PY) benchmarks/produce_consume.py

clean:
	rm -rf $(VENV) build dist src/*.egg-info
