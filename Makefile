# Ferry's development tasks. `make help` lists them.
# Every module of the repository, as go.work lists them, is tested and linted.
MODULES := $(shell awk '/^use \(/{f=1;next} /^\)/{f=0} f{print $$1}' go.work)
# The release tool runs outside the workspace (the go.mod files name the
# release's version, which no proxy may have yet).
RELEASE := cd tools/release && GOWORK=off go run .
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
export FERRY_TEST_PG_URL ?= postgres://postgres@127.0.0.1:5432/test?sslmode=disable
export FERRY_TEST_NATS_URL ?= nats://127.0.0.1:4222
export FERRY_TEST_MYSQL_URL ?= mysql://root@127.0.0.1:3307/

.DEFAULT_GOAL := help

.PHONY: help
help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_\/-]+:.*## / {printf "  %-18s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: test
test: ## Run every test of every module with the race detector (needs the services: make services); failing modules are listed at the end
	@failed=""; for m in $(MODULES); do echo "== $$m"; (cd $$m && go test -race -count=1 -timeout 20m ./...) || failed="$$failed $$m"; done; \
	if [ -n "$$failed" ]; then echo "FAILED modules:$$failed"; exit 1; fi

.PHONY: test/short
test/short: ## Quicker tests: no race detector, smaller backlogs
	@failed=""; for m in $(MODULES); do echo "== $$m"; (cd $$m && go test -short -count=1 ./...) || failed="$$failed $$m"; done; \
	if [ -n "$$failed" ]; then echo "FAILED modules:$$failed"; exit 1; fi

.PHONY: test/race
test/race: test ## Same as test (the race detector is always on)

.PHONY: test/crash-long
test/crash-long: ## The relay crash test with 100,000 events and 100 SIGKILLs
	cd cmd/ferry && FERRY_CRASH_LONG=1 go test -race -count=1 -timeout 30m -run 'TestRelayCrash' -v .

.PHONY: fuzz
fuzz: ## Fuzz every sink's wire (validate → publish → decode is the identity) for FUZZTIME each (default 60s)
	@for m in ferrysink/ferrywebhook ferrysink/ferrynats ferrysink/ferrykafka ferrysink/ferryrabbit; do echo "== $$m"; (cd $$m && go test -run '^$$' -fuzz '^FuzzWire$$' -fuzztime $${FUZZTIME:-60s} .) || exit 1; done

.PHONY: demo
demo: ## See Ferry work end to end on its embedded defaults (nothing to install); demo ARGS=--crash for crashes
	go run ./cmd/ferry demo $(ARGS)

.PHONY: e2e
e2e: ## Try Ferry end to end with its command line on the local PostgreSQL and NATS
	@.ci/smoke

.PHONY: lint
lint: ## gofmt, go vet and staticcheck on every module
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || (gofmt -l $$(git ls-files '*.go'); echo "run gofmt -w on the files above"; exit 1)
	@for m in $(MODULES); do echo "== $$m"; (cd $$m && go vet ./... && go run $(STATICCHECK) ./...) || exit 1; done

.PHONY: bench
bench: ## go test benchmarks, then the relay's drain and latency figures against the local services
	go test -run '^$$' -bench . -benchtime 2x ./... 
	cd ferrysink/ferrynats && go test -run '^$$' -bench . .
	cd cmd/ferry && go run . bench drain --database-url "$(FERRY_TEST_PG_URL)" --nats-url "$(FERRY_TEST_NATS_URL)" --events 100000
	cd cmd/ferry && go run . bench latency --database-url "$(FERRY_TEST_PG_URL)" --nats-url "$(FERRY_TEST_NATS_URL)" --rate 1000 --duration 20s

.PHONY: build
# The version and commit `ferry version` prints, stamped by make build:
# the build's own stamping is off where GOFLAGS has -buildvcs=false.
VERSION ?= $(shell git describe --tags --match 'v[0-9]*' --always --dirty 2>/dev/null || echo unknown)
COMMIT ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
MODIFIED ?= $(shell git diff --quiet HEAD 2>/dev/null || echo true)
BIN ?= $(CURDIR)/bin/ferry

build: ## Build the ferry command into bin/ (BIN=path), its version and commit stamped
	cd cmd/ferry && go build -ldflags "-X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.modified=$(MODIFIED)" -o $(BIN) .

.PHONY: image
IMAGE ?= $(CURDIR)/bin/ferry-image
GOARCH ?= $(shell go env GOARCH)

image: ## Write the OCI image of ferry (static binary, CA certificates, non-root user; no daemon, no base image) as an OCI layout in bin/ferry-image (IMAGE=dir)
	cd cmd/ferry && CGO_ENABLED=0 GOOS=linux GOARCH=$(GOARCH) go build -trimpath -ldflags "-s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT) -X main.modified=$(MODIFIED)" -o $(CURDIR)/bin/ferry-linux-$(GOARCH) .
	cd deploy && SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || echo 0) go run ./image --binary $(CURDIR)/bin/ferry-linux-$(GOARCH) --arch $(GOARCH) --version $(VERSION) --commit $(COMMIT) --out $(IMAGE)

.PHONY: tidy
tidy: ## go mod tidy every module as a user's go command sees it (siblings from a proxy of this tree)
	@$(RELEASE) tidy

.PHONY: release
release: ## Cut release VERSION (v0.1.0): set every sibling require, tidy, check, build, commit and tag every module path
	@test -n "$(filter v%,$(VERSION))" || (echo "make release VERSION=v0.1.0"; exit 1)
	@$(RELEASE) release $(VERSION)

.PHONY: release/dry-run
release/dry-run: ## Everything make release does, in a scratch clone: nothing here changes
	@test -n "$(filter v%,$(VERSION))" || (echo "make release/dry-run VERSION=v0.1.0"; exit 1)
	@$(RELEASE) release $(VERSION) -dry-run

.PHONY: release/set
release/set: ## Make every sibling require (and go.work) name VERSION, without releasing
	@$(RELEASE) set $(VERSION)

.PHONY: release/check
release/check: ## No replace in a go.mod, one version for every sibling, no import of another module's internal/, one go directive
	@$(RELEASE) check

.PHONY: release/prove
release/prove: ## From a scratch clone: a module proxy of the tagged tree, go install of the command, programs/ with go get, an upgrade with go get -u
	@$(RELEASE) prove

.PHONY: services
services: ## Start PostgreSQL, NATS (JetStream), RabbitMQ and a MariaDB with a binlog locally if they are not running
	@.ci/services
