# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e ".[test,tensorboard]"
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/zoo list
	$(BIN)/python -c "from zoo_core import LibreYOLO; m = LibreYOLO('resnet18', names=['cat', 'dog']); p = m.save('runs/demo/resnet18.safetensors'); print('saved', p, '->', LibreYOLO(p))"

test: $(STAMP)
	$(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
