# Two set-up commands: `make run` (main job on the default scenario) and `make test`.
PY := .venv/bin/python
VENV_STAMP := .venv/.installed

$(VENV_STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test]'
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	touch $(VENV_STAMP)

.PHONY: install run test bench lint
install: $(VENV_STAMP)

run: $(VENV_STAMP)
	.venv/bin/servecast batch notebooks/grids/default.yaml --out runs/default

test: $(VENV_STAMP)
	$(PY) -m ruff check model tests
	$(PY) -m pytest -n 2 --dist worksteal

bench: $(VENV_STAMP)
	$(PY) -m model.bench.suite

lint: $(VENV_STAMP)
	$(PY) -m ruff check model tests
