# The two commands a newcomer needs (see README). Both build/refresh the cached
# venv first (scripts/setup.sh), so they work on a fresh clone.
.PHONY: demo test lint

demo:
	@VENV=$$(bash scripts/setup.sh) && "$$VENV/bin/dspark-sglang" demo

# Two pytest-xdist workers, each test file whole on one worker (its module-scoped
# engines and servers start once); tests/cpu_threads.py gives each worker its share of
# the cores.
test:
	@VENV=$$(bash scripts/setup.sh) && "$$VENV/bin/python" -m ruff check . && "$$VENV/bin/python" -m pytest -q -n 2 --dist loadfile

lint:
	@VENV=$$(bash scripts/setup.sh) && "$$VENV/bin/python" -m ruff check . && "$$VENV/bin/python" -m ruff format --check .
