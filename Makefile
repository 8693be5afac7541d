# The two commands a newcomer needs (see README). Both build/refresh the cached
# venv first (scripts/setup.sh), so they work on a fresh clone.
.PHONY: demo test lint

demo:
	@VENV=$$(bash scripts/setup.sh) && "$$VENV/bin/dspark-sglang" demo

test:
	@VENV=$$(bash scripts/setup.sh) && "$$VENV/bin/python" -m ruff check . && "$$VENV/bin/python" -m pytest -q

lint:
	@VENV=$$(bash scripts/setup.sh) && "$$VENV/bin/python" -m ruff check . && "$$VENV/bin/python" -m ruff format --check .
