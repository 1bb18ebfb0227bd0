# make run: the dashboard on demo data at http://127.0.0.1:5000.   make test: the whole suite.
VENV := .venv
PYTHON := $(VENV)/bin/python
FLASK := $(VENV)/bin/flask --app wsgi

.PHONY: run test lint venv

venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -r requirements.txt
	touch $@

run: venv
	$(FLASK) claw init-db
	$(FLASK) run --host 127.0.0.1 --port 5000

lint: venv
	$(VENV)/bin/ruff check .

test: lint
	$(PYTHON) -m pytest
