# The two commands: `make demo` and `make test` (`make test-fast` while editing). Both set up
# .venv on first use (idempotent).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --disable-pip-version-check -q
comma  := ,

.PHONY: demo test test-fast lint bench proto clean services

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip

# Install into the venv only when it is this checkout's. A .venv that links to another
# checkout's environment (or whose editable redline lives in another tree) is used as it is:
# `pip install -e` here would point that checkout's venv at this tree.
define venv_install
	@where=$$($(PY) -I -c 'import importlib.util as u; s = u.find_spec("redline"); print(s.origin if s else "")' 2>/dev/null); \
	case "$$([ -L $(VENV) ] && echo link)$$where" in \
	  "" | $(CURDIR)/src/* | $(abspath $(VENV))/*) $(PIP) install -e '$(1)' && touch $@ $(2) ;; \
	  *) echo "$(VENV) is another checkout's environment ($${where:-a link}): not installing into it" ;; \
	esac
endef

# Runtime + converters + offline builder + an HTTP client: what the demo needs.
$(VENV)/.demo-installed: pyproject.toml | $(VENV)/bin/python
	$(call venv_install,.[demo])

# Everything the test suite needs, torch included (CPU build, pinned).
$(VENV)/.dev-installed: pyproject.toml | $(VENV)/bin/python
	$(call venv_install,.[dev$(comma)torch],$(VENV)/.demo-installed)

# What the tests need outside Python: one small script per service in tools/services.d/ (each
# checks before it installs, so a warm machine pays nothing).
services:
	@for f in tools/services.d/*.sh; do bash "$$f" || exit 1; done

demo: $(VENV)/.demo-installed
	$(PY) -m redline.demo

# Four workers, a test file (or a doc page: tests/conftest.py's groups) each at a time: many
# tests wait on servers and child processes, so workers beyond the two cores fill their idle
# time (on 2 cores: 468 s with two, 387 s with three, 316 s with four; PYTEST_WORKERS=0 runs it
# in one process). Bytecode is kept even where the environment says
# PYTHONDONTWRITEBYTECODE: the suite starts hundreds of Python processes (servers, the CLI, doc
# blocks), each of which would compile redline's modules anew, and every worker would rewrite
# every test module's asserts (~10 s of CPU a worker). README.md, "Development".
PYTEST_WORKERS ?= 4
KEEP_BYTECODE := env -u PYTHONDONTWRITEBYTECODE
test: $(VENV)/.dev-installed services
	$(KEEP_BYTECODE) $(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadgroup

# The unit and in-process tests, in one and a half to two minutes: no child servers, no doc pages.
test-fast: $(VENV)/.dev-installed services
	$(KEEP_BYTECODE) $(PY) -m pytest -q -m "not slow"

# The comparisons of docs/performance.md, run and written into its tables (about ten minutes on
# 2 cores). The peers run from environments of their own: `bash benchmarks/peers/setup.sh`
# makes MLServer's, Feast's and Ray Serve's (or BENCH_ARGS=--install-peers, during the run); see
# `$(PY) benchmarks/run_all.py --help` for the areas.
bench: $(VENV)/.dev-installed services
	PYTHONPATH=src:. $(PY) benchmarks/run_all.py $(BENCH_ARGS)

# Test helpers and the tests whose doubles stand in for a protocol (typed against it, so mypy
# catches a missing attribute); a new double's module joins the list.
TYPED_TESTS := tests/conftest.py tests/logwatch.py tests/serving/helpers.py \
	tests/pipeline/conftest.py tests/monitoring/served.py tests/monitoring/helpers.py \
	tests/monitoring/otlp.py tests/scaling/procs.py tests/scaling/podrun.py tests/docs/runner.py \
	tests/serving/test_hostile.py tests/pipeline/test_hostile.py tests/monitoring/test_tracing.py \
	tests/monitoring/test_grpc_lean.py tests/monitoring/test_metrics.py \
	benchmarks/observability/tick_stall.py

lint: $(VENV)/.dev-installed
	$(VENV)/bin/ruff check src tests benchmarks
	$(VENV)/bin/lint-imports  # the layering of DESIGN.md's table (.importlinter)
	$(VENV)/bin/mypy src
	$(VENV)/bin/mypy --follow-imports=silent $(TYPED_TESTS)

# The generated modules must load on every protobuf and grpcio that pyproject.toml allows
# (protobuf 4.25 to 7.x): grpcio-tools 1.62 writes code without the runtime version checks that
# later releases add (code from protoc N refuses any protobuf older than N). It runs in its own
# venv, so its protobuf<5 never meets the dev extra's.
PROTO_TOOLS := build/proto-tools
PROTOC      := $(PROTO_TOOLS)/bin/python -m grpc_tools.protoc

$(PROTO_TOOLS)/bin/python:
	$(PYTHON) -m venv $(PROTO_TOOLS)
	$(PROTO_TOOLS)/bin/python -m pip --disable-pip-version-check -q install 'grpcio-tools==1.62.3'

proto: $(PROTO_TOOLS)/bin/python
	$(PROTOC) -I src/redline/proto --python_out=src/redline/proto \
	  --pyi_out=src/redline/proto \
	  --grpc_python_out=src/redline/proto src/redline/proto/grpc_service.proto
	sed -i 's/^import grpc_service_pb2 as/from . import grpc_service_pb2 as/' \
	  src/redline/proto/grpc_service_pb2_grpc.py
	# A private descriptor pool, so tritonclient's own `inference.*` protos can share the process.
	sed -i 's/^DESCRIPTOR = _descriptor_pool.Default().AddSerializedFile(/_POOL = _descriptor_pool.DescriptorPool()\nDESCRIPTOR = _POOL.AddSerializedFile(/' \
	  src/redline/proto/grpc_service_pb2.py
	# redline's own API (entity predictions), a separate service so the KServe proto stays standard.
	$(PROTOC) -I src/redline/proto --python_out=src/redline/proto \
	  --grpc_python_out=src/redline/proto src/redline/proto/redline_v1.proto
	sed -i 's/^import redline_v1_pb2 as/from . import redline_v1_pb2 as/' \
	  src/redline/proto/redline_v1_pb2_grpc.py

clean:
	rm -rf $(VENV) .redline build dist .pytest_cache .mypy_cache .ruff_cache
