# asyncrl: every target sets itself up first. docs/installation.md says which torch build TORCH_SPEC gets, e.g.
# `make install TORCH_SPEC=torch==2.13.0+cuXYZ TORCH_INDEX=https://download.pytorch.org/whl/cuXYZ` for a CUDA build.
PYTHON ?= python3
VENV ?= .venv
# The pin resolves to whatever build pip's indexes offer: a CPU wheel where pip is configured with one (the
# development machine's find-links), PyPI's CUDA build on a stock Linux machine. TORCH_INDEX picks the index.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp
TORCH_STAMP := $(VENV)/.torch-spec
ARGS ?=

.PHONY: install test lint train bench peers clean FORCE

install: $(STAMP)

# Rewritten (so newer than $(STAMP)) only when TORCH_SPEC or TORCH_INDEX differ from the last install's.
$(TORCH_STAMP): FORCE
	@mkdir -p $(VENV)
	@test "$$(cat $@ 2>/dev/null)" = "$(TORCH_SPEC) $(TORCH_INDEX)" || echo "$(TORCH_SPEC) $(TORCH_INDEX)" > $@

EXTRAS := test,stats,export,doom,video,wandb,mujoco,gymnax,multiagent,ray,sweep,envpool

# Everything goes in with uv where uv installs (it downloads, unpacks and byte-compiles in parallel), given pip's
# find-links and constraints (scripts/uv_sources.py) so that torch is the build pip would pick; else with pip. With
# TORCH_INDEX, pip installs torch from that index first and uv keeps it.
UV_INSTALL = $(BIN)/uv pip install -q --python $(BIN)/python --compile-bytecode
$(STAMP): setup.cfg pyproject.toml Makefile scripts/uv_sources.py $(TORCH_STAMP)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q uv || true
	$(if $(TORCH_INDEX),$(BIN)/python -m pip install -q --upgrade --index-url $(TORCH_INDEX) "$(TORCH_SPEC)")
	{ test -x $(BIN)/uv && $(UV_INSTALL) $$($(BIN)/python scripts/uv_sources.py) \
		$(if $(TORCH_INDEX),,"$(TORCH_SPEC)") -e ".[$(EXTRAS)]"; } \
		|| { $(BIN)/python -m pip install -q --upgrade $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) "$(TORCH_SPEC)" \
		&& $(BIN)/python -m pip install -q -e ".[$(EXTRAS)]"; }
	touch $(STAMP)

lint: install
	$(BIN)/ruff check asyncrl tests scripts benchmarks

# Test files run in parallel processes (pytest-xdist), one more than the cores this process may use (its CPU affinity
# and cgroup quota; the tests wait on processes: tests/conftest.py) up to TEST_JOBS; each file stays in one
# process, so a module's fixtures are built once. TEST_JOBS=1 runs them one after another. Files are handed out in
# collection order, longest first (tests/conftest.py's SLOW_FIRST), not xdist's default of most tests first.
TEST_JOBS ?= 4

# Bytecode caches are written even where PYTHONDONTWRITEBYTECODE is set (as on the development machine), so that each
# test module and asyncrl module is compiled once, not again in every test process and fresh interpreter: collecting
# the tests took 9.1 CPU-s a process without the caches, 6.1 with them (9.4 and 6.0 s wall).
test: install lint
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -q -n logical --maxprocesses $(TEST_JOBS) --dist loadfile \
		--no-loadscope-reorder

# Continues the experiment when it already has a checkpoint.
train: install
	$(BIN)/asyncrl-train --env atari_pong $$(test -d train_dir/atari_pong/checkpoints && echo --resume) $(ARGS)

BENCH_STAMP := $(VENV)/.bench-stamp

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[test,stats,export,doom,video,wandb,mujoco,gymnax,multiagent,ray,sweep,envpool,bench]"
	touch $(BENCH_STAMP)

bench: install $(BENCH_STAMP)
	$(BIN)/asyncrl-bench $(ARGS)

# Sample Factory 2 and CleanRL's PPO Atari script in venvs of their own under peers/ (scripts/peer_venvs.py; CleanRL's
# source is cloned from GitHub unless ARGS="--cleanrl-src CLONE"): the peers of scripts/time_to_score.py and of
# `make bench ARGS="--sf2-python peers/sf2venv/bin/python"`.
peers: install
	$(BIN)/python scripts/peer_venvs.py peers --torch-spec "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--torch-index $(TORCH_INDEX)) $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
