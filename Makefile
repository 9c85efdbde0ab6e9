# lnkmem — two commands: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test soak bench clean

$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	rm -rf .demo-state
	$(BIN)/lnk-lnkmem index examples/home .demo-state --agent examples/agent
	$(BIN)/lnk-lnkmem search examples/home .demo-state --agent examples/agent "how do we deploy the service"

test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 tests

soak: $(STAMP)
	$(BIN)/python bench/soak.py
	NOTES_EDITOR_S=20 $(BIN)/python -m pytest -q tests/test_notes_history.py -k rename_editor

bench: $(STAMP)
	$(BIN)/python bench/bench_local.py

clean:
	rm -rf $(VENV) .demo-state .pytest_cache build *.egg-info
