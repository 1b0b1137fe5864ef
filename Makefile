# warp developer entry points. `make test` and `make demo` work on a fresh
# machine with nothing but Python: they create .venv and install into it.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
WARP := $(VENV)/bin/warp
PIP := $(PY) -m pip
DEMO ?= demo-out
PYTEST_ARGS ?=

.PHONY: install test demo bench lint docs docs-check clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# the CPU build of torch first, pinned, so nothing pulls a CUDA build
	$(PIP) install -q torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[test,s3,zarr,torch]'
	touch $@

test: install
	$(PY) -m pytest -n 2 -q $(PYTEST_ARGS)

demo: install
	rm -rf $(DEMO)
	@echo "== 1. sample detection data (COCO labels, a few broken samples) -> tensor warehouse"
	$(PY) -m warpdata.sampledata detection $(DEMO)/coco --count 64 >/dev/null
	$(WARP) etl --config $(DEMO)/coco/transform.toml
	@echo "== 2. publish the warehouse to the local store, then read it back"
	WARP_STORE=$(DEMO)/store $(WARP) publish demo/coco --from "$$($(WARP) etl -q --config $(DEMO)/coco/transform.toml)"
	WARP_STORE=$(DEMO)/store $(WARP) ls
	WARP_STORE=$(DEMO)/store $(WARP) inspect demo/coco --head 3
	WARP_STORE=$(DEMO)/store WARP_CACHE_DIR=$(DEMO)/cache $(WARP) warm demo/coco
	WARP_CACHE_DIR=$(DEMO)/cache $(WARP) cache stats
	$(WARP) inspect --verify "$$($(WARP) etl -q --config $(DEMO)/coco/transform.toml)"
	@echo "== 3. a WebDataset tar -> one TBL v2 file, verified"
	$(PY) -m warpdata.sampledata wds $(DEMO)/shard.tar --count 64 >/dev/null
	$(WARP) tar-to-tbl $(DEMO)/shard.tar $(DEMO)/shard.tbl --verify
	@echo "== 4. a u16 volume -> tiled, zstd-compressed Zarr v3 pyramid"
	$(PY) -m warpdata.sampledata volume $(DEMO)/volume --count 64 >/dev/null
	$(WARP) etl --config $(DEMO)/volume/volume.toml
	$(WARP) inspect --verify $(DEMO)/volume/volume.zarr

bench: install
	$(PIP) install -q -c constraints.txt -e '.[bench]'
	$(PY) bench/startup.py
	$(PY) bench/features_throughput.py && $(PY) bench/features_memory.py && $(PY) bench/features_build.py
	$(PY) bench/publish_registry.py
	$(PY) bench/read_stream.py
	$(PY) bench/tiles_write.py
	$(PY) bench/tbl_bench.py
	$(PIP) install -q -c constraints.txt --no-deps litdata mosaicml-streaming webdataset lightning-utilities braceexpand Brotli python-snappy zstd tqdm catalogue cramjam && $(PY) bench/warehouse_etl.py && $(PY) bench/warehouse_reader.py  # peers --no-deps: they pull CUDA torch/torchvision (DESIGN.md §8)

lint: install
	$(VENV)/bin/ruff check .

docs: install
	$(PY) -m warpdata.docgen write

docs-check: install
	$(PY) -m warpdata.docgen check

clean:
	rm -rf $(VENV) $(DEMO) build dist *.egg-info .pytest_cache .ruff_cache bench/out
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
