# The README's commands. Each target makes .venv itself: torch 2.14.1 and torchvision 0.29.1 first (the
# torchvision release built for that torch), then this project.
# torch comes from the pip index configured here (PyPI serves the CUDA build on Linux, several GB of
# NVIDIA packages); TORCH_INDEX=https://download.pytorch.org/whl/cpu takes PyTorch's CPU wheel instead.
PYTHON ?= python3
TORCH_INDEX ?=
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: demo test lint format bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.14.1 torchvision==0.29.1 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

## demo: train the demo preset as a Ray job on a local head with token auth (scripts/demo.sh)
demo: $(STAMP)
	bash scripts/demo.sh

## test: lint, then the whole test suite
test: $(STAMP)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check .

format: $(STAMP)
	$(PY) -m ruff format .
	$(PY) -m ruff check --fix .

## bench: the four papers' tables re-measured beside their baselines (bench/*.py, two hours or more on
## 2 cores, docs/LOG.md times each script; each script has --full for a GPU cluster), then
## docs/BENCHMARKS.md from bench/results/
bench: $(STAMP)
	mkdir -p bench/results
	$(PY) bench/packing.py --out bench/results/packing.md
	$(PY) bench/microbatch.py
	$(PY) bench/bload_table.py --videos 300 --epochs 3 --runs 3
	$(PY) bench/refurbish.py
	$(PY) bench/refurbish.py --real
	$(PY) bench/video_feed.py
	$(PY) bench/averaging.py
	$(PY) bench/averaging.py --only ablation
	$(PY) bench/batch_rule.py
	$(PY) bench/pipeline.py > bench/results/pipeline.txt && cat bench/results/pipeline.txt
	$(PY) bench/startup.py > bench/results/startup.txt && cat bench/results/startup.txt
	$(PY) bench/report.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build *.egg-info
