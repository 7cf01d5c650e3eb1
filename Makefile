# sovereign-audit: every target does its own set-up on a fresh Debian machine.
#   make demo   build our kernel, audit it, gather evidence and write the signed report
#   make test   install everything the tests need, then run them
#   make corpus audit real wheels from the package index against hand-written expectations
PYTHON ?= python3
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# hipcc/libamdhip64/rocm-device-libs: build gfx* objects here; llvm-15: AMDGPU disassembly and the
# offload bundler; libopenblas-dev: the vendor library the tests link on purpose; patchelf: the
# verneed fixture; chromium: the report is rendered in a real browser.
APT_PACKAGES := hipcc libamdhip64-dev rocm-device-libs libopenblas-dev patchelf llvm-15 chromium g++ openssl jq gcc-aarch64-linux-gnu gcc-mingw-w64-x86-64 clang-15 lld-15 mono-mcs libarchive-tools gcab squashfs-tools rpm zstd xz-utils bzip2  # mingw, clang/lld: the PE and Mach-O fixtures; mcs: .NET assemblies; bsdtar, gcab, mksquashfs: archives the audit cannot open; rpmbuild: RPM packages; zstd, xz, bzip2: compressed files
STAMP := .make

.PHONY: all setup apt pip demo test bench corpus fuzz clean

all: test

setup: $(STAMP)/apt $(STAMP)/pip

$(STAMP)/apt: Makefile
	@mkdir -p $(STAMP)
	@missing=$$(for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || echo $$p; done); \
	if [ -n "$$missing" ]; then \
	  echo "installing:" $$missing; \
	  $(SUDO) apt-get update -q && DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q $$missing; \
	fi
	@touch $@

$(STAMP)/pip: pyproject.toml
	@mkdir -p $(STAMP)
	$(PYTHON) -m pip install -q "torch==2.13.0"
	$(PYTHON) -m pip install -q -e ".[test]"
	@touch $@

demo: setup
	$(PYTHON) -m audit run --out out/demo

test: setup
	$(PYTHON) -m pytest -q

bench: setup
	$(PYTHON) bench/audit_speed.py

# the real-world corpus: ~7 GB of wheels and Debian packages (Linux, Windows, macOS; kept in CORPUS_CACHE), each audited
# and compared with bench/corpus_expectations.toml; the tables go to docs/corpus.md
CORPUS_CACHE ?= $(HOME)/.cache/sovereign-audit/corpus
corpus: setup
	$(PYTHON) bench/corpus.py --cache $(CORPUS_CACHE) --write docs/corpus.md

# the contract fuzzer for as long as asked: make fuzz FUZZ_SECONDS=3600 [FUZZ_CASES=2000 FUZZ_JOBS=4 FUZZ_SEED=n]
# (reproducers of any violation under out/fuzz/violations/, the table in out/fuzz/summary.txt)
FUZZ_SECONDS ?= 600
FUZZ_CASES ?= 0
FUZZ_JOBS ?= 2
fuzz: setup
	$(PYTHON) -m bench.fuzz --seconds $(FUZZ_SECONDS) --cases $(FUZZ_CASES) --jobs $(FUZZ_JOBS) --out out/fuzz $(if $(FUZZ_SEED),--seed $(FUZZ_SEED))

clean:
	rm -rf build out $(STAMP) tests/_fixtures_build
