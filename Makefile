# Thin driver over CMake/ctest/pytest. `make demo` runs the main job; `make test` runs every suite
# this machine can run (cpu + jit always, gpu when a CUDA device is visible, Python tests).
BUILD ?= build
JOBS ?= $(shell nproc)
PYTHON ?= python3
CMAKE_FLAGS ?=
GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
CTEST_LABELS := cpu|jit$(if $(GPU),|gpu,)

.PHONY: all build demo test test-cpp test-python bench prebuild format install clean

all: build

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS)

build: $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

demo: build
	$(BUILD)/bench/flashport_demo

test: test-cpp test-python

test-cpp: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L "$(CTEST_LABELS)"

test-python:
	$(PYTHON) -m pip install -q --no-build-isolation .
	$(PYTHON) -m pytest -q tests/python

bench: build
	$(BUILD)/bench/flashport_bench --out $(BUILD)/bench_flashport.jsonl
	$(PYTHON) bench/peer_torch.py $(BUILD)/bench_flashport.jsonl

prebuild: build
	cmake --build $(BUILD) --target prebuild

install: build
	cmake --install $(BUILD) --prefix $(or $(PREFIX),/usr/local)

format:
	git ls-files '*.cpp' '*.hpp' '*.h' '*.cu' '*.cuh' | xargs clang-format -i

clean:
	rm -rf $(BUILD)
