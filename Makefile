# warp developer entry points. `make test` and `make demo` work on a fresh
# machine with nothing but Python: they create .venv and install into it from
# the hash-pinned locks in requirements/ (nothing is resolved at install time;
# `make lock` refreshes them, see README "Development").
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WARP := $(VENV)/bin/warp
PIP := $(PY) -m pip
DEMO ?= demo-out
PYTEST_ARGS ?=
# --no-deps + --require-hashes: the lock is the whole environment; wheels only, so no
# build step resolves its own unpinned build dependencies.
LOCKED_INSTALL := $(PIP) install -q --disable-pip-version-check --require-hashes --no-deps --only-binary :all:
# `warpdata` is the distribution name of another project (and of warp before it was renamed
# warp-toolchain): both install the module `warpdata`, so the old one goes first.
PROJECT_INSTALL := { $(PIP) uninstall -q -y warpdata 2>/dev/null || true; } && \
	$(PIP) install -q --disable-pip-version-check --no-deps --no-build-isolation -e .

.PHONY: install install-demo test s3-conformance demo bench bench-summary gpu-wheels gpu-check lint docs docs-check readme lock clean

install: $(VENV)/.installed

install-demo: $(VENV)/.installed-demo

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)

# the demo needs no torch and installs none (requirements/demo.lock is the core only)
$(VENV)/.installed-demo: pyproject.toml requirements/demo.lock | $(VENV)/bin/python
	$(LOCKED_INSTALL) -r requirements/demo.lock
	$(PROJECT_INSTALL)
	touch $@

# tests, S3, Zarr readers and the CPU build of torch (pinned by hash in the lock)
$(VENV)/.installed: pyproject.toml requirements/dev.lock | $(VENV)/bin/python
	$(LOCKED_INSTALL) -r requirements/dev.lock
	$(PROJECT_INSTALL)
	$(PIP) check -q 2>/dev/null || $(PIP) check
	touch $@ $(VENV)/.installed-demo

# Re-resolve the locks after a dependency change in pyproject.toml (needs the
# package index). Pins already in a lock are kept; `make lock UPGRADE=1` moves
# everything to the newest allowed releases.
LOCK_VENV := .venv-lock
LOCK_FLAGS := -q --generate-hashes --allow-unsafe --no-strip-extras --no-emit-index-url \
	--no-emit-find-links --annotation-style line $(if $(UPGRADE),--upgrade)
lock:
	test -x $(LOCK_VENV)/bin/pip-compile || { $(PYTHON) -m venv $(LOCK_VENV) && $(LOCK_VENV)/bin/pip install -q pip-tools; }
	CUSTOM_COMPILE_COMMAND="make lock" $(LOCK_VENV)/bin/pip-compile $(LOCK_FLAGS) \
		--extra test --extra s3 --extra zarr --extra torch --extra dask --extra ray --extra sign -o requirements/dev.lock pyproject.toml requirements/build.in
	CUSTOM_COMPILE_COMMAND="make lock" $(LOCK_VENV)/bin/pip-compile $(LOCK_FLAGS) \
		-o requirements/demo.lock pyproject.toml requirements/build.in

test: install
	$(PY) -m pytest -n 2 -q $(PYTEST_ARGS)

# warp against a real S3 server: a one-node Ceph RADOS Gateway on 127.0.0.1 (tests/support/ceph.py
# starts it, installing Debian's packages if missing, and stops it; docs/s3-conformance.md). One
# process: one cluster. Skipped with the reason where Ceph cannot be installed or started.
RGW_TESTS := tests/storage/test_conformance_rgw.py tests/storage/test_rgw_s3.py tests/storage/test_rgw_etl.py
s3-conformance: install
	WARP_RGW=1 $(PY) -m pytest -p no:xdist -m rgw -q -rs $(RGW_TESTS) $(PYTEST_ARGS)

# Everything the demo writes stays under $(DEMO)/: store, cache and outputs.
DEMO_ENV := WARP_STORE=$(DEMO)/store WARP_CACHE_DIR=$(DEMO)/cache
demo: install-demo
	rm -rf $(DEMO)
	@echo "== 1. sample detection data (COCO labels, a few broken samples) -> tensor warehouse"
	$(PY) -m warpdata.sampledata detection $(DEMO)/coco --count 64 >/dev/null
	$(DEMO_ENV) $(WARP) etl --config $(DEMO)/coco/transform.toml > $(DEMO)/warehouse.path
	@cat $(DEMO)/warehouse.path
	@echo "== 2. publish the warehouse to the demo store, then read it back"
	$(DEMO_ENV) $(WARP) publish demo/coco --from "$$(cat $(DEMO)/warehouse.path)"
	$(DEMO_ENV) $(WARP) ls
	$(DEMO_ENV) $(WARP) inspect demo/coco --head 3
	$(DEMO_ENV) $(WARP) warm demo/coco
	$(DEMO_ENV) $(WARP) cache stats
	$(DEMO_ENV) $(WARP) inspect --verify "$$(cat $(DEMO)/warehouse.path)"
	@echo "== 3. a WebDataset tar -> one TBL v2 file, verified"
	$(PY) -m warpdata.sampledata wds $(DEMO)/shard.tar --count 64 >/dev/null
	$(DEMO_ENV) $(WARP) tar-to-tbl $(DEMO)/shard.tar $(DEMO)/shard.tbl --verify
	@echo "== 4. a u16 volume -> tiled, zstd-compressed Zarr v3 pyramid"
	$(PY) -m warpdata.sampledata volume $(DEMO)/volume --count 64 >/dev/null
	$(DEMO_ENV) $(WARP) etl --config $(DEMO)/volume/volume.toml
	$(DEMO_ENV) $(WARP) inspect --verify $(DEMO)/volume/volume.zarr
	@echo "== 5. a folder of images -> a published dataset in one command; pictures of the artifacts"
	$(PY) -m warpdata.sampledata photos $(DEMO)/photos >/dev/null
	$(DEMO_ENV) $(WARP) ingest imagefolder $(DEMO)/photos/imgs demo/photos
	$(DEMO_ENV) $(WARP) inspect demo/photos --preview $(DEMO)/photos.png
	$(DEMO_ENV) $(WARP) inspect "$$(cat $(DEMO)/warehouse.path)" --preview $(DEMO)/warehouse.png

bench: install
	$(PIP) install -q -c constraints.txt -e '.[bench]'
	$(PY) bench/startup.py
	$(PY) bench/features_throughput.py && $(PY) bench/features_memory.py && $(PY) bench/features_build.py
	$(PY) bench/publish_registry.py
	$(PY) bench/read_stream.py
	$(PY) bench/tiles_write.py
	$(PY) bench/tbl_bench.py
	$(PY) bench/etl_kit.py && $(PY) bench/etl_scale.py && $(PY) bench/publish_multipart.py
	$(PIP) install -q -c constraints.txt --no-deps litdata mosaicml-streaming webdataset lightning-utilities braceexpand Brotli python-snappy zstd tqdm catalogue cramjam && $(PY) bench/warehouse_etl.py && $(PY) bench/warehouse_reader.py  # peers --no-deps: they pull CUDA torch/torchvision (docs/design.md §8)
	$(PY) bench/summary.py

# the summary table of whatever bench/out/*.figures.json the last runs left
bench-summary:
	$(PY) bench/summary.py

# The GPU check (bench/gpu_check.py): `make gpu-wheels` here downloads the wheels a CUDA
# machine of this workplace lacks into .whl/ (CPython 3.12, the lock's versions); `make
# gpu-check` there runs `pytest -m gpu`, the cpu/gpu identity check and the GPU tiles
# benchmark with its own python3 and writes the figures to $$OUT/gpu_check.json or
# bench/out/gpu_check.json. GPU_CHECK_ARGS=--dry-run prints the plan anywhere.
GPU_CHECK_ARGS ?=
gpu-wheels:
	$(PYTHON) bench/gpu_check.py --download-wheels .whl

gpu-check:
	$(PYTHON) bench/gpu_check.py $(GPU_CHECK_ARGS)

lint: install
	$(VENV)/bin/ruff check .

docs: install
	$(PY) -m warpdata.cli.docgen write

docs-check: install
	$(PY) -m warpdata.cli.docgen check

# README.md's console outputs: rerun its blocks (tests/cli/test_readme.py, recording what each
# command prints under build/readme/) and rewrite the shown lines that moved
# (tests/support/readme_outputs.py; CONTRIBUTING.md, "The README's outputs"). A block whose
# command exits otherwise than the README says records nothing; the others are still rewritten,
# and the target fails with the test's failures.
readme: install
	rm -rf build/readme && mkdir -p build/readme
	README_RECORD_DIR=$(CURDIR)/build/readme $(PY) -m pytest -n 2 -q tests/cli/test_readme.py -k block_runs; \
	status=$$?; PYTHONPATH=tests $(PY) -m support.readme_outputs write build/readme README.md && exit $$status

clean:
	rm -rf $(VENV) $(LOCK_VENV) $(DEMO) build dist *.egg-info .pytest_cache .ruff_cache bench/out
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
