# The quick-start commands are `make demo`, `make test-fast` and `make test`; each builds .venv when needed.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

# make demo: the pipeline end to end on local processes (python -m pipeline run): ingest -> train
# each variant on WORKERS worker processes -> select and publish -> serve one example prediction ->
# the canary's decision when a version was published over another.
DEMO_DIR ?= runs/demo
SAMPLE_DIR ?= datasets/fashion-mnist-sample
WORKERS ?= 2
# Default: every variant defined in trainer/variants.py (read with the standard library alone) but
# DEMO_SKIP: the demo trains the best variant by cross-validation on the sample, `cnn_gap`, beside
# the baseline `cnn` (`make bench-variants`; docs/results/model-quality.md). A third variant in
# parallel takes the demo past 4 minutes on 2 cores (docs/results/demo-time.md).
# `make demo DEMO_SKIP=` trains them all.
DEMO_SKIP ?= cnn_dropout cnn_batchnorm cnn_vgg
VARIANTS ?= $(shell $(PYTHON) -c 'import sys; from trainer.variants import VARIANTS; \
	print(*(name for name in VARIANTS if name not in sys.argv[1:]))' $(DEMO_SKIP))
BATCH_SIZE_PER_REPLICA ?= 16
# sync (all-reduce) or parameter-server (a chief, the workers and PARAMETER_SERVERS ps processes).
STRATEGY ?= sync
PARAMETER_SERVERS ?= 1
# Unset: every variant at once, faster than one at a time on 2 cores (docs/results/demo-time.md).
PARALLELISM ?=
# ROLLOUT=promote|rollback decides the canary whatever its evidence (`make demo ROLLOUT=rollback`).
ROLLOUT ?=
# DATA_SOURCE overrides both the official mirror and the fallback to the sample.
DATA_FLAGS = $(if $(DATA_SOURCE),--data-source $(DATA_SOURCE),--fallback-source $(SAMPLE_DIR))
PIPELINE_RUN = $(PY) -m pipeline run --storage-root $(DEMO_DIR) --workers $(WORKERS) \
	--variants $(VARIANTS) --batch-size-per-replica $(BATCH_SIZE_PER_REPLICA) --strategy $(STRATEGY) \
	$(if $(filter parameter-server,$(STRATEGY)),--parameter-servers $(PARAMETER_SERVERS)) \
	$(if $(PARALLELISM),--parallelism $(PARALLELISM)) $(if $(ROLLOUT),--rollout $(ROLLOUT)) $(DATA_FLAGS)

.PHONY: demo serve evaluate test test-fast bench bench-train bench-serve bench-capacity bench-variants lock clean \
	mlflow-ui

# The dev lock, then the project itself, editable: its packages from this checkout, its dependencies
# from the lock alone (--no-deps; setuptools, which builds it, is in the lock too). Installed by uv
# (tools/uv.py, pinned, pip-installed under .cache/ on first use): the same packages as pip, in a
# third of its time.
$(INSTALLED): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	uv=$$($(PYTHON) -m tools.uv) && \
	$$uv pip install --quiet --compile-bytecode --python $(PY) -r requirements.txt && \
	$$uv pip install --quiet --compile-bytecode --python $(PY) --no-deps --no-build-isolation -e .
	touch $@

demo: $(INSTALLED)
	$(PIPELINE_RUN)

# The same run (memoized after `make demo`), then the server stays up until Ctrl-C.
serve: $(INSTALLED)
	$(PIPELINE_RUN) --serve

# MLflow's UI on what `make demo` tracked (its embedded store: SQLite and artifacts under
# $(DEMO_DIR)/mlflow), or on MLFLOW_TRACKING_URI's database when that is set; loopback only.
# (A tracking server has its own UI: open MLFLOW_TRACKING_URI itself.)
MLFLOW_PORT ?= 5000
mlflow-ui: $(INSTALLED)
	$(VENV)/bin/mlflow ui --host 127.0.0.1 --port $(MLFLOW_PORT) \
		--backend-store-uri $${MLFLOW_TRACKING_URI:-sqlite:///$(abspath $(DEMO_DIR))/mlflow/mlflow.db}

# The version `make demo` published, scored as an outside caller would: the 300 holdout images
# (datasets/fashion-mnist-holdout, never read by training or selection) as PNG through `image_bytes`.
evaluate: $(INSTALLED)
	$(PY) -m benchmarks.holdout_accuracy --model-repo $(DEMO_DIR)/models

# Every test, spread over the cores (pytest-xdist; a module's tests stay together, so its fixtures
# are built once). test-fast leaves out the tests marked slow: those that train or export a model,
# start a server, a pipeline or a script, or build a virtualenv.
PYTEST_WORKERS ?= auto
# The virtualenvs the slow tier runs users' paths in (tools/virtualenvs.py, standard library only) are
# built in the background, beside the dev install and then the tests: a pip install keeps about one
# core busy, and a test that needs one of them waits for it.
# Prometheus, which the autoscaling query's test and the end-to-end run's scaling scrape the server
# with, is unpacked from Debian's package (tools/prometheus.py, standard library only) beside them: a
# few seconds, done before the tests start.
# The control-plane tiers run beside them, from the moment .venv is there: tests/cluster/ (make
# test-cluster) and the end-to-end run on the real node (tests/e2e_node/, make test-e2e), each in a
# tier of its own, at once. Building their Go programs the first time keeps both cores busy for many
# minutes; once built, their tests mostly wait on the controllers and the pods. Their output is
# printed when they end. The end-to-end tier is the longest lane (Pulumi's engine and provider, the
# workflow on the real node), so the pytest lane runs at a lower CPU priority (nice 10): it takes the
# cores the tiers leave, and the whole run ends sooner.
TIER_LOG = .cache/control-plane/test.log
test:
	$(PYTHON) -m tools.virtualenvs & built=$$!; \
	$(PYTHON) -m tools.prometheus & prometheus=$$!; \
	$(MAKE) --no-print-directory $(INSTALLED) || exit 1; wait $$prometheus || exit 1; \
	mkdir -p $(dir $(TIER_LOG)); $(PY) -m tools.control_plane all > $(TIER_LOG) 2>&1 & tier=$$!; \
	$(PY) -m ruff check . && \
	nice -n 10 $(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadscope; tested=$$?; \
	wait $$tier; tiered=$$?; echo "--- the control-plane tiers (make test-cluster and make test-e2e) ---"; \
	cat $(TIER_LOG); \
	wait $$built && [ $$tested = 0 ] && exit $$tiered || exit 1

# The tier's real node and its images (tools/control_plane/nodes/real.py, images.py) run Debian's packages:
# containerd, runc and the CNI plugins, iptables for kube-proxy, iptables and ipset for kube-router's
# network policies, buildah and mmdebstrap for the images, busybox for the helper image. Installed once as root (.ci/run does it); a no-op when all are there.
NODE_PACKAGES = containerd runc containernetworking-plugins iptables ipset buildah mmdebstrap busybox-static
.PHONY: node-packages
node-packages:
	@dpkg-query -W -f='$${db:Status-Status} $${Package}\n' $(NODE_PACKAGES) 2>/dev/null | \
		grep -c '^installed ' | grep -qx $(words $(NODE_PACKAGES)) || \
		{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
			$(NODE_PACKAGES); }

# The control-plane tier alone: the real API server and the controllers the stacks install, built
# from the Go module proxy (once; Go's caches keep them), then tests/cluster/ in a network namespace of
# its own. One test: make test-cluster TIER_ARGS="-k usage_error". docs/development.md says more.
TIER_ARGS ?=
.PHONY: test-cluster
test-cluster: $(INSTALLED)
	$(PY) -m tools.control_plane test $(TIER_ARGS)

# The whole workflow end to end on the tier's real node (tests/e2e_node/), in a tier of its own: every
# pod run for real from the images built from our Dockerfiles: about 8 minutes warm alone (docs/results).
E2E_ARGS ?=
.PHONY: test-e2e
test-e2e: $(INSTALLED)
	$(PYTHON) -m tools.prometheus
	$(PY) -m tools.control_plane e2e $(E2E_ARGS)

test-fast: $(INSTALLED)
	$(PY) -m ruff check .
	$(PY) -m pytest -n $(PYTEST_WORKERS) --dist loadscope -m "not slow"

# The tests' pinned upstream CRDs (testdata/pins.py): from ../shared/schemas when it is there, else
# downloaded once into .cache/fixtures/, every file SHA-256 checked. Tests never download.
.PHONY: fixtures
fixtures: $(INSTALLED)
	$(PY) -m testdata

bench: bench-train bench-serve

bench-train: $(INSTALLED)
	$(PY) -m benchmarks.train_throughput

bench-serve: $(INSTALLED)
	$(PY) -m benchmarks.serve_throughput

# How many requests in flight one predictor replica (one core) holds with p99 under
# serving.autoscaling.latencyObjectiveMs, on the model `make demo` published, and the scaling targets
# that follow (docs/results/serving-capacity.md). CONFIG=FILE for another config's serving keys.
CONFIG ?=
bench-capacity: $(INSTALLED)
	$(PY) -m benchmarks.serve_capacity --model-repo $(DEMO_DIR)/models $(if $(CONFIG),--config $(CONFIG)) \
		--plot docs/results/serving-capacity.png

# Each variant's accuracy by 5-fold cross-validation on the sample's 500 training images, seeds 1
# and 2 (tens of minutes on 2 cores): what chose the demo's variants (docs/results/model-quality.md).
# Not part of `make bench`.
bench-variants: $(INSTALLED)
	$(PY) -m benchmarks.variant_cv

# Re-resolve the locks from pyproject.toml's pins, without installing (pip --dry-run --report):
# requirements.txt (the dev extra, everything) and requirements/<image>.txt, each image's extras
# within the dev lock. The next make reinstalls .venv from the new lock.
lock: $(INSTALLED)
	$(PY) tools/lock.py

# Before `pulumi up --stack $(STACK)`: docker (and its daemon), k3d, pulumi, kubectl and git, each new
# enough; STACK=gke checks gcloud and gke-gcloud-auth-plugin instead of k3d (infra/preflight.py).
# The standard library suffices, so it runs before .venv exists and takes a second.
STACK ?= local
.PHONY: preflight
preflight:
	$(PYTHON) -m infra.preflight --stack $(STACK)

# The whole system on a real k3d cluster (tools/e2e.py): preflight, a throwaway stack `local` in a file
# backend under .cache/e2e/, `pulumi up`, one workflow run, one prediction through the Gateway, then
# destroy. Needs what `make preflight` checks. E2E_FLAGS="--keep --timeout-minutes 180" for its options.
E2E_FLAGS ?=
.PHONY: e2e
e2e: $(INSTALLED)
	$(PY) tools/e2e.py $(E2E_FLAGS)

clean:
	rm -rf runs
