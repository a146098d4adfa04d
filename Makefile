# Shoal build glue. GNU make.
#
#   make venv    create .venv and install shoal editable: what the broker needs only
#                (re-runs only when pyproject.toml is newer than .venv/.stamp)
#   make run     start a broker on $(HOST):$(PORT) in the foreground
#   make lint    install the lint extra (.venv/.stamp-lint), run ruff and mypy as pyproject.toml says
#   make test    install the test and report extras (.venv/.stamp-test), run the whole suite
#                with the hot path compiled, then the tests that reach it as pure Python
#                (SHOAL_PURE_PYTHON=1); each in TEST_WORKERS parallel processes
#   make compiled  build the hot path's modules with mypyc (best effort; `make run` and
#                `make test` do it); `make pure` removes what it built
#   make arenas  build build/libhuge_arenas.so (ipc/huge_arenas.c: Python's arenas on huge pages,
#                ipc/huge_pages.py; best effort; `make run`, `make test` and `make compiled` do it)
#   make perf    a first throughput figure (perf/quick.py)
#   make clean   remove caches and build output (keeps .venv; `make distclean` removes it too)

PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.stamp
TEST_STAMP := $(VENV)/.stamp-test
LINT_STAMP := $(VENV)/.stamp-lint

HOST ?= 127.0.0.1
PORT ?= 5672
WORKERS ?=
DATA_DIR ?=
LOG_LEVEL ?= info
PYTEST_ARGS ?=
PERF_ARGS ?=

# The hot path compiled with mypyc (ipc/compiled.py): C extensions beside these sources, which
# Python imports in their place. Best effort: when the build fails, everything runs as Python.
# Not compiled: classes that interpreted code subclasses (ipc/logfile.py's AppendFiles) or that
# tests patch per instance (workers/worker.py), and frame_buffer.py (a NamedTuple of memoryviews).
# The supervisor's per-message path is here too (ring loop, dispatcher, a queue's entries and
# consumers, the vhosts' batch, routing), not broker/queues/queue.py (a Queue becomes a
# FeaturedQueue by a class switch in place), broker/messages/message.py (a plain message reads
# its absent fields from class-level defaults; a BCC message is a class switch),
# broker/topology/vhost.py and its step hosts (VirtualHost inherits two of them) nor
# broker/topology/exchange_types.py (a test patches a router's method). A package holding a compiled module calls
# ipc.compiled.sources_only in its __init__.
COMPILED := workers/codec.py workers/channel_frames.py workers/content_assembler.py \
	workers/consumer_target.py workers/channel_consumers.py workers/outgoing.py \
	workers/connection.py workers/connection_state.py workers/handshake.py workers/output_queue.py \
	workers/channel.py workers/channel_inbox.py workers/channel_deliveries.py \
	workers/connection_handler.py \
	workers/publisher_confirms.py workers/confirm_gate.py workers/delivery_tags.py \
	workers/arenas.py workers/channel_config.py workers/frame_buffer.py ipc/ring.py ipc/arena.py \
	broker/runtime/ring_loop.py broker/runtime/dispatch.py broker/runtime/publishing.py \
	broker/runtime/deliveries.py broker/runtime/open_channels.py broker/runtime/credit_flow.py \
	broker/runtime/arena_accounts.py broker/runtime/teardown.py broker/topology/vhosts.py \
	broker/queues/sliced_work.py \
	broker/queues/queue_entry.py broker/queues/consumer_manager.py broker/queues/fifo_entries.py \
	broker/topology/routing.py broker/topology/binding_index.py
# What mypyc writes beside the sources and at the root (its shared library): removed before a
# build and by `make pure`.
COMPILED_SO := workers/*.so ipc/*.so broker/*/*.so *__mypyc.*.so
COMPILE_STAMP := build/.stamp-compiled
# What the extensions were built from, by content (ipc/compiled.py: a source rewritten as it was,
# by a checkout or a stash, keeps its extension).
COMPILED_RECORD := build/compiled-sources.sha256
COMPILE_LOG := build/mypyc.log

.PHONY: venv run lint test perf clean distclean compiled compile-locked pure smoke arenas

# Python's small-object arenas on transparent huge pages (ipc/huge_pages.py loads it with ctypes;
# no Python headers needed). Best effort: without it every process runs on 4 KiB pages and the
# supervisor's log says so.
CC ?= cc
ARENAS_LIB := build/libhuge_arenas.so

arenas: $(ARENAS_LIB)

$(ARENAS_LIB): ipc/huge_arenas.c
	@mkdir -p build
	@if $(CC) -O2 -Wall -shared -fPIC -o $@.tmp $< 2> build/arenas.log; then mv $@.tmp $@; \
		echo "built $@ (Python's arenas on huge pages)"; \
	else rm -f $@.tmp; echo "note: could not build $@ (build/arenas.log): 4 KiB pages"; fi

venv: $(STAMP)

# Editable in setuptools' compat mode: a .pth puts the checkout itself on sys.path, so the
# shared library mypyc writes at its root (<hash>__mypyc.*.so, which every compiled module imports)
# is found by `.venv/bin/shoal` too, not only by `python -m` run from the checkout.
EDITABLE := --config-settings editable_mode=compat

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install $(EDITABLE) -e .
	touch $(STAMP)

# The clients the tests drive, PySpark for the report (about 1 GB): only for make test / perf.
$(TEST_STAMP): $(STAMP)
	$(BIN)/python -m pip install $(EDITABLE) -e '.[test]'
	touch $(TEST_STAMP)

$(LINT_STAMP): $(STAMP)
	$(BIN)/python -m pip install $(EDITABLE) -e '.[lint]'
	touch $(LINT_STAMP)

# The build removes and rewrites the extensions: `make run` and `make test` started together in
# one checkout take turns (flock), and the second one builds only if the first left it to do.
$(COMPILE_STAMP): $(STAMP) $(COMPILED)
	mkdir -p build
	flock build/.compile.lock $(MAKE) --no-print-directory compile-locked

compile-locked:
	@if [ -f $(COMPILE_STAMP) ] && [ -z "$$(find $(COMPILED) $(STAMP) -newer $(COMPILE_STAMP))" ]; then \
		exit 0; fi; \
	if [ -f $(COMPILE_STAMP) ] && [ -z "$$(find $(STAMP) -newer $(COMPILE_STAMP))" ] && \
		[ -f $(COMPILED_RECORD) ] && ( for m in $(COMPILED:.py=); do ls $$m.*.so > /dev/null 2>&1 || exit 1; done ) && \
		[ "$$(awk '{print $$2}' $(COMPILED_RECORD) | xargs)" = "$(strip $(COMPILED))" ] && \
		sha256sum --check --status $(COMPILED_RECORD); then \
		echo "hot path: sources rewritten as they were built, extensions kept"; touch $(COMPILE_STAMP); exit 0; fi; \
	$(BIN)/python -m pip install -q $(EDITABLE) -e '.[compile]' && \
	rm -f $(COMPILED_SO) $(COMPILED_RECORD) && \
	if $(BIN)/mypyc $(COMPILED) > $(COMPILE_LOG) 2>&1; then \
		touch $(COMPILED_SO); \
		sha256sum $(COMPILED) > $(COMPILED_RECORD); \
		echo "hot path compiled with mypyc: $(words $(COMPILED)) modules"; \
	else \
		echo "note: mypyc could not build the hot path ($(COMPILE_LOG)); it runs as pure Python"; \
		rm -f $(COMPILED_SO); \
	fi; \
	touch $(COMPILE_STAMP)

compiled: $(COMPILE_STAMP) $(ARENAS_LIB)

pure:
	mkdir -p build
	flock build/.compile.lock rm -f $(COMPILED_SO) $(COMPILE_STAMP) $(COMPILED_RECORD)

run: venv compiled
	$(BIN)/shoal serve --host $(HOST) --port $(PORT) --log-level $(LOG_LEVEL) $(if $(WORKERS),--workers $(WORKERS)) $(if $(DATA_DIR),--data-dir $(DATA_DIR))

# ruff over the whole tree; mypy over the packages [tool.mypy] names (broker ipc workers cli tracing report).
lint: $(LINT_STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

# No per-test timeout plugin on purpose: the integration fixtures bound every wait
# (see tests/integration/harness.py). The second pass runs as pure Python only the tests that
# reach a module of COMPILED (marked reaches_compiled by tests/conftest.py, see
# tests/compiled_reach.py): for the others both passes would run the same code; of the integration
# tests, those whose subject is not the hot path (marked compiled_only by tests/integration/conftest.py:
# the data directory, management, links, configuration, the CLI; and the report's end-to-end run,
# whose Spark job is the same in both passes) run in the first pass only.
# Each pass runs in TEST_WORKERS processes (pytest-xdist): the integration tests mostly wait on
# brokers and sockets, so more processes than cores pay. --dist loadgroup keeps the tests sharing
# a module's broker or the report's SparkSession on one process (their xdist_group, set by
# tests/conftest.py). The tests marked serial (they look at all of /dev/shm) run after, alone;
# exit status 5 is pytest's "no test selected" (PYTEST_ARGS may select none of one kind).
# TEST_MARKS selects in both passes: `make test TEST_MARKS='not soak and not slow'` for a quick run;
# `make test TEST_WORKERS=0` runs each pass in one process.
TEST_MARKS ?= not soak
TEST_WORKERS ?= 4
PYTEST := $(BIN)/pytest -q -p no:cacheprovider
# $(call test_pass,ENVIRONMENT,MARKS): the tests MARKS selects, the serial ones last
define test_pass
	$(1) $(PYTEST) -n $(TEST_WORKERS) --dist loadgroup -m "not serial and ($(2))" $(PYTEST_ARGS) || test $$? -eq 5
	$(1) $(PYTEST) -m "serial and ($(2))" $(PYTEST_ARGS) || test $$? -eq 5
endef
test: $(TEST_STAMP) compiled
	$(call test_pass,,$(TEST_MARKS))
	@echo "== the tests that reach the compiled modules, as pure Python (SHOAL_PURE_PYTHON=1: the sources are imported)"
	$(call test_pass,SHOAL_PURE_PYTHON=1,reaches_compiled and not compiled_only and ($(TEST_MARKS)))

perf: $(TEST_STAMP) compiled
	$(BIN)/python -m perf.quick $(PERF_ARGS)

clean: pure
	rm -rf build dist .pytest_cache .mypy_cache .ruff_cache perf/results
	find . -path ./$(VENV) -prune -o -name __pycache__ -type d -prune -exec rm -rf {} +

distclean: clean
	rm -rf $(VENV) *.egg-info
