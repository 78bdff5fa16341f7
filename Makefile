# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-all install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e ".[test,tensorboard]"
	# Bytecode for zoo's own modules: an editable install leaves them as source, and where
	# PYTHONDONTWRITEBYTECODE is set (as on the CI machine) every process would compile them again.
	$(BIN)/python -m compileall -q zoo_core plugins
	touch $(STAMP)

install: $(STAMP)

# The main job: resnet18 on the built-in shapes set, two CPU ranks over gloo (DDP), about a
# minute; prints the metrics and the run directory.
demo: $(STAMP)
	$(BIN)/zoo list --ddp-capable
	$(BIN)/zoo train resnet18 --data shapes --epochs 10 --imgsz 64 --batch 32 --device cpu,cpu augment=false nbs=32 warmup_epochs=1

# Two workers: the CI machine has two cores, and most tests are single-threaded CPU work
# (tests/conftest.py gives each worker one torch thread). TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2

# `make test` leaves out the tests marked slow (the learning tests over 45 s) to fit CI's time
# budget; `make test-all` runs every test.
test: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "not slow"

test-all: $(STAMP)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS)

clean:
	rm -rf $(VENV) runs .pytest_cache
