# The README's two commands: `make demo` and `make test`. Everything they need is installed
# here, into the git-ignored project-local .venv (torch 2.11.0 gives tch its libtorch;
# .cargo/config.toml points LIBTORCH at it).
SHELL := /bin/bash
VENV := $(CURDIR)/.venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The Python environment packages the tests train on (verifiers, openenv-core): a venv of
# their own, as a user's would be (verifiers pins openai<3, .venv has openai 3).
ECO := $(CURDIR)/.venv-eco
ECO_STAMP := $(ECO)/.installed
export PATH := $(VENV)/bin:$(PATH)
CARGO ?= cargo
BIN := target/release/agent-r1
# libtorch's OpenMP workers spin less in barriers: see .cargo/config.toml and docs/training.md's
# "CPU threads". A value set in the environment wins.
export GOMP_SPINCOUNT ?= 10000

.PHONY: all venv eco-venv build test demo demo-math demo-python-agent fmt clippy ci bench clean-venv

all: build

$(STAMP): requirements.txt
	@command -v python3 >/dev/null || { echo "python3 is required to install torch"; exit 2; }
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	ln -sfn "$$($(PY) -c 'import os, torch; print(os.path.dirname(torch.__file__))')" $(VENV)/libtorch
	touch $(STAMP)

venv: $(STAMP)

$(ECO_STAMP): requirements-eco.txt
	@command -v python3 >/dev/null || { echo "python3 is required"; exit 2; }
	test -x $(ECO)/bin/python || python3 -m venv $(ECO)
	$(ECO)/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-eco.txt
	touch $(ECO_STAMP)

eco-venv: $(ECO_STAMP)

build: $(STAMP)
	$(CARGO) build --release --bin agent-r1

# No separate `cargo build` first: the tests' dev-dependencies turn on other features of
# shared crates (metrics-util's `debugging`), so it would compile the workspace twice; the
# test build makes target/release/agent-r1 too.
test: $(STAMP) $(ECO_STAMP)
	$(CARGO) test --workspace --release

# A fresh run every time (same seed, same figures); the run directory is runs/demo.
demo: build
	rm -rf runs/demo
	./$(BIN) train --preset demo --out runs/demo

# The second env family: arithmetic word problems with the calculator (runs/math).
demo-math: build
	rm -rf runs/math
	./$(BIN) train --preset math --out runs/math

# The demo's task driven by an agent written in Python (examples/agents/search_agent.py, the
# official `openai` client) instead of the built-in loop (runs/demo-python-agent).
demo-python-agent: build
	rm -rf runs/demo-python-agent
	./$(BIN) train --config examples/demo_python_agent.toml --out runs/demo-python-agent

fmt:
	$(CARGO) fmt --all --check

# The second pass checks the binary as `cargo build --release` makes it: without the tests'
# features (`fault-injection`, `testing`), which the first pass turns on.
clippy: $(STAMP)
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings
	$(CARGO) clippy -p agent-r1 --release --bins --lib -- -D warnings

ci: test fmt clippy

# The rollout rows inject tool faults (a test double): a build with `fault-injection`.
bench: $(STAMP)
	$(CARGO) build --release --bin agent-r1 --features fault-injection
	./scripts/bench.sh

clean-venv:
	rm -rf $(VENV) $(ECO)
