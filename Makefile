.PHONY: setup demo test lint format stack-up stack-down images images-local
setup:
	bash scripts/setup.sh
demo:
	bash scripts/demo.sh
test:
	bash scripts/test.sh
lint:
	.venv/bin/ruff check . && .venv/bin/ruff format --check .
format:
	.venv/bin/ruff format . && .venv/bin/ruff check --fix .
stack-up:
	.venv/bin/tritonship stack up
stack-down:
	.venv/bin/tritonship stack down
images:
	bash scripts/images.sh
images-local:
	bash scripts/images.sh --local
