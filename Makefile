# Cubicle: build, run and test. See README.md.
SHELL       := /usr/bin/env bash
GO          ?= go
DATA_DIR    ?= /var/lib/cubicle
LISTEN      ?= 0.0.0.0:3000
RUNTIME     ?= runc
INSTALL_FLAGS ?=
# Extra `cubicle serve` flags for make run, e.g. --ca-certificates FILE.
SERVE_FLAGS ?=
STAMP       := .cache/install.stamp
# Fuzzing time per target: FUZZTIME for make fuzz, FUZZTIME_TEST for the
# bounded run in make test (scripts/fuzz lists the targets).
FUZZTIME      ?= 60s
FUZZTIME_TEST ?= 2s

export PATH := /usr/local/go/bin:/usr/local/bin:$(PATH)

.PHONY: all build run test test-unit test-e2b test-deploy test-cluster-sdk bench proto clean install deps image

all: build

build:
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -o bin/cubicle-agent ./cmd/cubicle-agent
	$(GO) build -o bin/cubicle ./cmd/cubicle
	CGO_ENABLED=0 $(GO) build -o bin/cubicle-volume-s3 ./cmd/cubicle-volume-s3
	CGO_ENABLED=0 $(GO) build -o bin/buildkitd github.com/moby/buildkit/cmd/buildkitd
	$(GO) build -o bin/cubicle-testnet ./test/testnet
	$(GO) build -o bin/cubicle-testcluster ./test/testcluster

# Dependencies (apt packages, runsc, base image, node_modules): scripts/install, once.
# The stamp is refreshed when the install script or the JS lockfile changes.
$(STAMP): scripts/install scripts/build-rootfs scripts/build-code-interpreter scripts/code-interpreter-requirements.txt $(wildcard kernels/java/src/cubicle/kernel/*.java) test/e2b-js/package-lock.json test/e2b-py/requirements.txt
	CUBICLE_DATA_DIR=$(DATA_DIR) scripts/install $(INSTALL_FLAGS)
	@mkdir -p $(dir $(STAMP)) && touch $(STAMP)

deps: $(STAMP)

install:
	CUBICLE_DATA_DIR=$(DATA_DIR) scripts/install $(INSTALL_FLAGS)
	@mkdir -p $(dir $(STAMP)) && touch $(STAMP)

run: deps build
	@mkdir -p $(DATA_DIR)
	@if [ ! -s $(DATA_DIR)/dev-api-key ]; then \
		umask 077; bin/cubicle apikey create --data-dir $(DATA_DIR) --name dev > $(DATA_DIR)/dev-api-key.tmp \
		&& mv $(DATA_DIR)/dev-api-key.tmp $(DATA_DIR)/dev-api-key; fi
	@key=$$(cat $(DATA_DIR)/dev-api-key); port=$(lastword $(subst :, ,$(LISTEN))); \
	echo; echo "Cubicle API key: $$key"; echo; \
	echo "Point the e2b SDK at this server:"; \
	echo "  export E2B_API_URL=http://127.0.0.1:$$port"; \
	echo "  export E2B_SANDBOX_URL=http://127.0.0.1:$$port"; \
	echo "  export E2B_API_KEY=$$key"; echo
	exec bin/cubicle serve --data-dir $(DATA_DIR) --listen $(LISTEN) --runtime $(RUNTIME) $(SERVE_FLAGS)

test: deps build
	$(GO) vet ./...
	staticcheck ./...
	cd sdk/go && $(GO) vet ./... && staticcheck ./... && $(GO) test -count=1 ./...
	$(GO) test -count=1 -p 1 -timeout 40m ./...
	$(MAKE) test-deploy
	FUZZ_SEEDS=0 scripts/fuzz $(FUZZTIME_TEST)
	cd test/e2b-js && CUBICLE_IMAGES_DIR=$${CUBICLE_IMAGES_DIR:-$(DATA_DIR)/images} CUBICLE_RUNTIME=runc npm test
	cd test/e2b-js && CUBICLE_IMAGES_DIR=$${CUBICLE_IMAGES_DIR:-$(DATA_DIR)/images} CUBICLE_RUNTIME=runsc npm test
	cd test/e2b-py && CUBICLE_IMAGES_DIR=$${CUBICLE_IMAGES_DIR:-$(DATA_DIR)/images} CUBICLE_RUNTIME=runc .venv/bin/python -m pytest -q
	@# CubeSandbox's client (its templates too) and snapshots on runsc: its memory rollback and clone.
	cd test/e2b-py && CUBICLE_IMAGES_DIR=$${CUBICLE_IMAGES_DIR:-$(DATA_DIR)/images} CUBICLE_RUNTIME=runsc .venv/bin/python -m pytest -q tests/test_cubesandbox.py tests/test_cubesandbox_templates.py tests/test_snapshots.py tests/test_host_mounts.py
	$(MAKE) test-cluster-sdk

# The SDK suites' core flows against a cluster (issue 23): each JS file and the
# Python session get their own cubicle-testcluster (PostgreSQL, a pure control
# plane, two `cubicle node run` on loopback). JS and Python run at once, each
# with its own cluster; either failing fails the target.
CLUSTER_SDK_JS = sandbox commands files bigfile pty pause
CLUSTER_SDK_PY = test_sandbox test_commands test_files test_bigfile test_pty test_pause
test-cluster-sdk: deps build
	@export CUBICLE_CLUSTER=1 CUBICLE_IMAGES_DIR=$${CUBICLE_IMAGES_DIR:-$(DATA_DIR)/images} CUBICLE_RUNTIME=runc; \
	(cd test/e2b-js && node --test --test-concurrency=1 $(addprefix tests/,$(addsuffix .test.js,$(CLUSTER_SDK_JS)))) & js=$$!; \
	(cd test/e2b-py && .venv/bin/python -m pytest -q $(addprefix tests/,$(addsuffix .py,$(CLUSTER_SDK_PY)))) & py=$$!; \
	wait $$js; jsrc=$$?; wait $$py; pyrc=$$?; \
	echo "test-cluster-sdk: JS status $$jsrc, Python status $$pyrc"; [ $$jsrc -eq 0 ] && [ $$pyrc -eq 0 ]

.PHONY: fuzz
fuzz:
	scripts/fuzz $(FUZZTIME)

test-unit: build
	$(GO) vet ./...
	cd sdk/go && $(GO) vet ./... && $(GO) test -count=1 ./...
	$(GO) test -count=1 -p 1 -timeout 40m ./...
	$(MAKE) test-deploy

# The Helm chart rendered by Helm's own engine and decoded strictly into
# k8s.io/api types. Its own module (deploy/helm/charttest), so the main
# module does not pull Kubernetes; its modules come from the Go proxy. The
# flags the chart and the systemd units pass are checked against the binary
# by cmd/cubicle's TestDeployFlagsExist, in the main module's run.
#
# Then the chart's two images: deploy/image's TestImages (build tag
# deployimage, so `go test ./...` leaves it to this target) runs
# scripts/build-image and runs every program the node execs inside the
# result. Its debootstrap root and layers are cached in
# /var/cache/cubicle-image (CUBICLE_IMAGE_CACHE): a cold run adds minutes,
# a warm one well under one.
test-deploy: build
	cd deploy/helm/charttest && $(GO) vet ./... && staticcheck ./... && $(GO) test -count=1 ./...
	$(GO) vet -tags deployimage ./deploy/image && staticcheck -tags deployimage ./deploy/image
	$(GO) test -tags deployimage -count=1 -timeout 20m ./deploy/image

# The chart's container images, without Docker (scripts/build-image;
# docs/cluster.md, "Installing a cluster"): dist/cubicle.tar and
# dist/cubicle-builtins.tar, docker-archive tars for `ctr -n k8s.io images
# import`. PUSH=REGISTRY/REPO:TAG also pushes both (REPO and REPO-builtins).
IMAGE_REPO ?= ghcr.io/cubicle-dev/cubicle
IMAGE_TAG  ?= dev
PUSH       ?=
image: build
	scripts/build-image --repo $(IMAGE_REPO) --tag $(IMAGE_TAG) $(if $(PUSH),--push $(PUSH))

test-e2b: deps build
	cd test/e2b-js && CUBICLE_IMAGES_DIR=$${CUBICLE_IMAGES_DIR:-$(DATA_DIR)/images} npm test

# `make bench BENCH_FLAGS=--trace`: p50/p95 per create phase at c=1 and c=50
# instead (docs/performance.md).
bench: deps build
	CUBICLE_IMAGES_DIR=$${CUBICLE_IMAGES_DIR:-$(DATA_DIR)/images} node bench/create/run.js $(BENCH_FLAGS)

.PHONY: bench-codeinterp
bench-codeinterp: deps build
	CUBICLE_IMAGES_DIR=$${CUBICLE_IMAGES_DIR:-$(DATA_DIR)/images} node bench/codeinterp/run.js $(BENCH_FLAGS)

.PHONY: bench-snapshot
bench-snapshot: deps build
	CUBICLE_IMAGES_DIR=$${CUBICLE_IMAGES_DIR:-$(DATA_DIR)/images} node bench/snapshot/run.js $(BENCH_FLAGS)

.PHONY: bench-egress
bench-egress: deps build
	CUBICLE_IMAGES_DIR=$${CUBICLE_IMAGES_DIR:-$(DATA_DIR)/images} node bench/egress/run.js $(BENCH_FLAGS)

# Placement simulation: no sandboxes, no root; exits 1 on any oversell.
.PHONY: bench-scheduler
bench-scheduler:
	$(GO) run ./bench/scheduler $(BENCH_FLAGS)

# Data-plane tunnel vs a direct dial (loopback, no sandboxes, no root).
.PHONY: bench-dataplane
bench-dataplane:
	$(GO) test -run '^$$' -bench DataPlane -benchtime 300x ./bench/dataplane/

# Create → first command through a pure control plane on PostgreSQL and a
# `cubicle node run` vs embedded serve, same run (root, runc, PostgreSQL).
BENCH_CLUSTER_N ?= 50
.PHONY: bench-cluster
bench-cluster:
	CUBICLE_IMAGES_DIR=$${CUBICLE_IMAGES_DIR:-$(DATA_DIR)/images} $(GO) test -count=1 -run '^$$' -bench ClusterFirstCommand -benchtime $(BENCH_CLUSTER_N)x -timeout 30m ./bench/cluster/

proto:
	scripts/gen-proto

clean:
	rm -rf bin dist .cache test/e2b-js/node_modules
