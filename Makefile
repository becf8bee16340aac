# The two quick-start commands are `make demo` and `make test`; both build .venv when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

# make demo: ingest -> train each variant on WORKERS local worker processes -> select and publish.
DEMO_DIR ?= runs/demo
SAMPLE_DIR ?= ../shared/datasets/fashion-mnist-sample
WORKERS ?= 2
VARIANTS ?= cnn cnn_dropout cnn_batchnorm
BATCH_SIZE_PER_REPLICA ?= 16
# DATA_SOURCE overrides both the official mirror and the fallback to the sample.
INGEST_SOURCE = $(if $(DATA_SOURCE),--source $(DATA_SOURCE),--fallback-source $(SAMPLE_DIR))

.PHONY: demo test bench bench-train bench-serve lock clean

$(INSTALLED): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	touch $@

demo: $(INSTALLED)
	$(PY) -m trainer.ingest $(INGEST_SOURCE) --out $(DEMO_DIR)/data
	for variant in $(VARIANTS); do \
	  $(PY) -m trainer.launch --workers $(WORKERS) --log-dir $(DEMO_DIR)/logs/$$variant -- \
	    --model $$variant --data-dir $(DEMO_DIR)/data \
	    --checkpoint-dir $(DEMO_DIR)/checkpoints/$$variant --export-dir $(DEMO_DIR)/exports/$$variant \
	    --batch-size-per-replica $(BATCH_SIZE_PER_REPLICA) || exit 1; \
	done
	$(PY) -m trainer.select --candidates $(addprefix $(DEMO_DIR)/exports/,$(VARIANTS)) \
	  --data-dir $(DEMO_DIR)/data --model-repo $(DEMO_DIR)/models --model-name fmnist

test: $(INSTALLED)
	$(PY) -m ruff check .
	$(PY) -m pytest

bench: bench-train bench-serve

bench-train: $(INSTALLED)
	$(PY) -m benchmarks.train_throughput

bench-serve: $(INSTALLED)
	$(PY) -m benchmarks.serve_throughput

# Re-resolve the full lock from the direct pins in requirements.in.
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install --quiet -r requirements.in
	.lock-venv/bin/pip freeze --exclude-editable > requirements.txt
	rm -rf .lock-venv

clean:
	rm -rf runs
