# alkblobfs — see README.md. Targets: build, test, test-long, fuzz, lint,
# bench, man, install, deb, release, clean.

GO         ?= go
BIN        := bin/alkblobfs
TEST_FLAGS := -race -count=1 -timeout 14m -parallel 6 -p 4

.PHONY: build test test-fork test-long fuzz deps lint bench man install deb release clean

PREFIX  ?= /usr/local
DESTDIR ?=
# mount(8) looks for mount.fuse.alkblobfs in /sbin only.
SBINDIR ?= /sbin

# BUILD_VERSION is the version the binary (--version), the man pages and
# the package carry: scripts/version.sh, from CHANGELOG.md's newest release
# (0.1.0, or 0.1.0+g33b8a33 for a later commit). BUILDFLAGS and LDFLAGS
# add to the build (deb: -s). Every build is a position-independent
# executable (ASLR for the daemon, as distributions build Go), the same
# mode the tests build the binary in, so that make deb and make install
# find every package compiled already instead of compiling all again.
BUILD_VERSION ?= $(shell scripts/version.sh)
BUILDFLAGS    ?= -buildmode=pie
LDFLAGS       ?=

# A cold cache downloads and compiles the dependencies first, silently:
# say so.
build:
	@echo "building $(BIN) (the first build downloads and compiles the dependencies: a few minutes)"
	@test -n "$(BUILD_VERSION)" || { echo "make: no version: scripts/version.sh failed" >&2; exit 1; }
	$(GO) build -buildvcs=auto $(BUILDFLAGS) -ldflags '$(strip $(LDFLAGS) -X main.version=$(BUILD_VERSION))' -o $(BIN) ./cmd/alkblobfs

# deps installs the Debian packages the tests call (rsync, fuse3, bindfs,
# PostgreSQL, …); it does nothing when they are all present.
deps:
	scripts/ci-deps.sh

# The tests run under scripts/pg.sh and scripts/s3.sh, which start
# throw-away PostgreSQL and S3 (versitygw) servers for them and set
# ALKBLOBFS_REQUIRE_PG=1 and ALKBLOBFS_REQUIRE_S3=1: a test that cannot
# reach its server fails here instead of skipping.
# ALKBLOBFS_REQUIRE_FUSE=1 likewise turns a missing /dev/fuse into failures.
# The suite runs each fuzz target's seed corpus; the fuzzing itself
# (make fuzz: an instrumented build of every package it reaches, minutes
# of CPU before the first input) is make test-long's.
test: deps
	ALKBLOBFS_REQUIRE_FUSE=1 scripts/pg.sh scripts/s3.sh $(GO) test $(TEST_FLAGS) ./...
	$(MAKE) test-fork

# test-fork runs the tests of the patches to go-fuse (third_party/go-fuse,
# its own module, which ./... does not reach; PATCHES.md says what they
# cover). Upstream's own tests of the copy are not run: some sleep for
# ordering and fail on a loaded machine, on the unpatched release too.
test-fork:
	cd third_party/go-fuse && ALKBLOBFS_REQUIRE_FUSE=1 $(GO) test $(TEST_FLAGS) -run '^TestHandover' ./fs/ ./fuse/

# test-long also runs the slow tests (those that check ALKBLOBFS_LONG).
test-long: deps
	ALKBLOBFS_LONG=1 ALKBLOBFS_REQUIRE_FUSE=1 scripts/pg.sh scripts/s3.sh $(GO) test $(TEST_FLAGS) ./...
	$(MAKE) test-fork
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

# bench: the mount against the native directory and FUSE peers over the same
# filesystem (bindfs; JuiceFS with BENCH_JUICEFS=1, which scripts/juicefs.sh
# builds into a cache outside the repository), side by side in one run:
# reads, a large write, small files by cp -r, tar -x, rsync -a and 4 and 16
# parallel cp -r, and ls -l; every workload BENCH_REPS (3) times in rotated
# orders, printed as medians, min, max, ratios and the daemons' CPU (per
# file for small files) and peak RSS, and written to bench-results.json.
# Needs root and FUSE. BENCH_BASE=COMMIT adds a base build ("before").
# Quick run: BENCH_SIZE_MB=256 BENCH_SMALL=2000 BENCH_LS=20000 make bench
# BENCH_S3=1 adds the mount on an S3 large tier beside the local one.
bench: build
	scripts/bench.sh
	if [ -n "$(BENCH_S3)" ]; then scripts/s3.sh scripts/bench-s3.sh; fi

# man writes the man pages into MANOUT (bin/man): section 1 from the commands
# themselves, section 8 for the mount helper.
MANOUT ?= bin/man
man: build
	rm -rf $(MANOUT)
	$(BIN) man $(MANOUT)

# install puts the binary, the mount helper (a link to it in SBINDIR), the
# man pages (gzipped, as Debian policy has them; an uncompressed page of
# the same name from an older install is removed), the shell completions
# and the systemd unit under DESTDIR/PREFIX.
install: build man
	install -D -m 0755 $(BIN) $(DESTDIR)$(PREFIX)/bin/alkblobfs
	install -d $(DESTDIR)$(SBINDIR)
	ln -sf $(PREFIX)/bin/alkblobfs $(DESTDIR)$(SBINDIR)/mount.fuse.alkblobfs
	install -d $(DESTDIR)$(PREFIX)/share/man/man1 $(DESTDIR)$(PREFIX)/share/man/man8
	@for p in $(MANOUT)/*.1 $(MANOUT)/*.8; do \
		dir=$(DESTDIR)$(PREFIX)/share/man/man$${p##*.}; \
		gzip -9nc $$p > $$dir/$${p##*/}.gz && chmod 0644 $$dir/$${p##*/}.gz && rm -f $$dir/$${p##*/} || exit 1; \
	done
	install -d $(DESTDIR)$(PREFIX)/share/bash-completion/completions $(DESTDIR)$(PREFIX)/share/zsh/site-functions $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	$(BIN) completion bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/alkblobfs
	$(BIN) completion zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_alkblobfs
	$(BIN) completion fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/alkblobfs.fish
	install -d $(DESTDIR)$(PREFIX)/lib/systemd/system
	sed 's|/usr/local/bin/alkblobfs|$(PREFIX)/bin/alkblobfs|' contrib/systemd/alkblobfs@.service > $(DESTDIR)$(PREFIX)/lib/systemd/system/alkblobfs@.service

# deb builds DEBOUT/alkblobfs_VERSION_ARCH.deb (bin/) with nfpm from what
# install stages under DEBROOT for PREFIX=/usr: /usr/bin/alkblobfs, the
# helper /sbin/mount.fuse.alkblobfs, man pages, completions, the systemd
# unit, and in /usr/share/doc/alkblobfs the copyright file (scripts/copyright:
# the license of every module compiled in, from the module cache) and the
# changelog (scripts/debchangelog, from CHANGELOG.md; changelog.gz, the name
# of a native package's). It depends on fuse3 and on what dpkg-shlibdeps
# computes for the binary (libc6). nfpm runs with go run at a pinned
# version (checked against sum.golang.org), so that the packager's own
# dependencies stay out of the filesystem's go.mod; the first run
# downloads and compiles it (about 30 s). The packaged binary is a
# position-independent executable (lintian's hardening-no-pie) linked with
# -s (no symbol table or DWARF, as Debian ships binaries: lintian's
# unstripped-binary-or-object); it is built at BIN like any other. The
# package's version is BUILD_VERSION, as the binary's.
NFPM        ?= $(GO) run github.com/goreleaser/nfpm/v2/cmd/nfpm@v2.45.2
DEBROOT     ?= bin/debroot
DEBOUT      ?= bin
DEB_VERSION ?= $(BUILD_VERSION)
deb:
	rm -rf $(DEBROOT)
	$(MAKE) --no-print-directory install DESTDIR=$(abspath $(DEBROOT)) PREFIX=/usr \
		BUILD_VERSION='$(DEB_VERSION)' BUILDFLAGS='$(strip $(BUILDFLAGS) -buildmode=pie)' LDFLAGS='$(strip $(LDFLAGS) -s)'
	install -d $(DEBROOT)/usr/share/doc/alkblobfs
	$(GO) run ./scripts/copyright -license LICENSE $(BIN) > $(DEBROOT)/usr/share/doc/alkblobfs/copyright
	$(GO) run ./scripts/debchangelog -version '$(DEB_VERSION)' -date "$$(git log -1 --format=%cD 2>/dev/null)" CHANGELOG.md \
		| gzip -9n > $(DEBROOT)/usr/share/doc/alkblobfs/changelog.gz
	@mkdir -p $(DEBOUT)
	DEB_ROOT=$(abspath $(DEBROOT)) DEB_VERSION='$(DEB_VERSION)' DEB_ARCH=$$($(GO) env GOARCH) \
		DEB_SHLIBS="$$(scripts/shlibdeps.sh $(BIN))" \
		$(NFPM) package --config packaging/nfpm.yaml --packager deb --target $(DEBOUT)/

# release VERSION=X.Y.Z releases CHANGELOG.md's ## [Unreleased] entries as
# X.Y.Z: the entry becomes ## [X.Y.Z] - <today> under a new empty
# ## [Unreleased]; then a commit and the tag vX.Y.Z, not pushed
# (scripts/release.sh; TestMakeRelease).
release:
	scripts/release.sh '$(VERSION)'

clean:
	rm -rf bin
