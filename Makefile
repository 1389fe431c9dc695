# alkblobfs — see README.md. Targets: build, test, test-long, lint, bench, clean.

GO         ?= go
BIN        := bin/alkblobfs
TEST_FLAGS := -race -count=1 -timeout 14m

.PHONY: build test test-long fuzz deps lint bench clean

build:
	$(GO) build -buildvcs=auto -o $(BIN) ./cmd/alkblobfs

# deps installs the Debian packages the tests call (rsync, fuse3, bindfs,
# PostgreSQL, …); it does nothing when they are all present.
deps:
	scripts/ci-deps.sh

# The tests run under scripts/pg.sh, which starts throw-away PostgreSQL
# servers for them and sets ALKBLOBFS_REQUIRE_PG=1: a PostgreSQL test that
# cannot reach its server fails here instead of skipping.
# ALKBLOBFS_REQUIRE_FUSE=1 likewise turns a missing /dev/fuse into failures.
# After the suite (which runs each fuzz target's seed corpus), every fuzz
# target runs for FUZZTIME.
test: deps
	ALKBLOBFS_REQUIRE_FUSE=1 scripts/pg.sh $(GO) test $(TEST_FLAGS) ./...
	$(MAKE) fuzz

# test-long also runs the slow tests (those that check ALKBLOBFS_LONG).
test-long: deps
	ALKBLOBFS_LONG=1 ALKBLOBFS_REQUIRE_FUSE=1 scripts/pg.sh $(GO) test $(TEST_FLAGS) ./...
	$(MAKE) fuzz FUZZTIME=60s

# fuzz runs each go test -fuzz target for FUZZTIME: digest parsing,
# namespace names, and lookups and control-file writes through a real
# mount (root and FUSE).
FUZZTIME    ?= 5s
FUZZ_TARGETS := ./blob:FuzzParse ./namespaces:FuzzValidName ./fusefs:FuzzLookup ./fusefs:FuzzControl
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t##*:}; \
		echo "fuzz $$fn ($$pkg) for $(FUZZTIME)"; \
		ALKBLOBFS_REQUIRE_FUSE=1 $(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	done

lint:
	@out="$$(gofmt -l .)"; \
	if [ -n "$$out" ]; then echo "gofmt -l: these files need gofmt -w:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...

# bench: the mount against the native directory and bindfs over it, side by
# side in one run, printed as ratios. Needs root and FUSE.
# Quick run: BENCH_SIZE_MB=256 BENCH_SMALL=2000 BENCH_LS=20000 make bench
bench: build
	scripts/bench.sh

clean:
	rm -rf bin
