# lnkmem — two commands: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo lint test soak bench clean

# the checkout installed editable in setuptools' compat mode: a .pth naming the folder, where the
# default mode's import hook made every Python start import pathlib and urllib at `site`
# (~18 ms of CPU a start; the tests start the program and the fake bridges ~1,800 times).
# setuptools calls that mode transitional (its warning hidden here): where it is gone, the
# default mode is installed instead.
$(STAMP): setup.cfg pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e '.[test]' --config-settings editable_mode=compat 2>/dev/null \
	  || $(BIN)/python -m pip install -q -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	rm -rf .demo-state
	$(BIN)/lnk-lnkmem index examples/home .demo-state --agent examples/agent
	$(BIN)/lnk-lnkmem search examples/home .demo-state --agent examples/agent "how do we deploy the service"

# the rules kept by machine: the layers and no import cycle (.importlinter), and no private
# name imported from another module (ruff PLC2701, pyproject.toml). Ruff passes over imports
# within one top-level package, so each file is handed to it under a name outside lnkmem.
lint: $(STAMP)
	@$(BIN)/lint-imports --no-cache --config .importlinter >.lint-imports.out 2>&1 \
	  || { sed -n '/^Broken contracts/,$$p' .lint-imports.out; rm -f .lint-imports.out; \
	       echo "make lint: an import breaks the layers or makes a cycle (the contract and the import are named above; the rules: .importlinter)" >&2; exit 1; }
	@rm -f .lint-imports.out
	@bad=0; for f in $$(find lnkmem -name '*.py' | sort); do \
	  $(BIN)/ruff check --quiet --output-format concise --stdin-filename "private-names/$$f" - <"$$f" || bad=1; \
	done; [ $$bad = 0 ] || { echo "make lint: a private name (_x) is imported from another module (named above): make it public under a name that says what it is, or move it (rule: ruff PLC2701, pyproject.toml)" >&2; exit 1; }
	@echo "make lint: the layers, no cycles, no private names imported: kept"

# four workers on two cores: most tests wait on the engine's subprocesses, the fake bridges and
# their deadlines (a test's own CPU is about half its time), so two workers left a core idle;
# worksteal hands a worker that is done the tests another still holds (no long tail)
# The engine's and the fakes' bytecode made first, as an install does (bench_local.program()
# does the same): the program never writes its own (cli/main.py, §2.2) and the tests start it
# and the fake bridges with PYTHONDONTWRITEBYTECODE, so on a fresh checkout each of their
# thousands of starts compiled every module it imports (~0.1 s of CPU a start, a quarter of
# it). compileall skips what is up to date.
# Then pytest's own rewritten test modules, written once by one collection (where
# PYTHONDONTWRITEBYTECODE is set pytest reads them but never writes them, so each of the four
# workers rewrote all of them: 3.8 s of CPU a worker, 1.0 s where they are written).
test: lint
	$(BIN)/python -m compileall -q lnkmem fakes
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q --collect-only -p no:cacheprovider tests >/dev/null
	$(BIN)/python -m pytest -q -n 4 --dist worksteal tests

soak: $(STAMP)
	$(BIN)/python bench/soak.py
	$(BIN)/python bench/soak_reload.py --reloads 100
	for seed in 1 2 3; do $(BIN)/python bench/soak_writers.py --rounds 60 --seed $$seed || exit 1; done
	NOTES_EDITOR_S=20 $(BIN)/python -m pytest -q tests/test_notes_history.py -k rename_editor
	NOTES_SOAK=1 $(BIN)/python -m pytest -q tests/test_notes_history.py -k truncate_then_write

bench: $(STAMP)
	$(BIN)/python bench/bench_local.py

clean:
	rm -rf $(VENV) .demo-state .pytest_cache build *.egg-info
