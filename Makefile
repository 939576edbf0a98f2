# Thin driver over CMake/ctest/pytest. `make demo` runs the main job; `make test` runs every suite
# this machine can run (cpu + jit + hip always, gpu when a CUDA device is visible, Python tests).
BUILD ?= build
JOBS ?= $(shell nproc)
# Python: the extension is built and tested in a virtual environment of its own (.venv, made with
# --system-site-packages so a torch or transformers installed for the machine's python3 stays visible),
# never in the active Python; `make test PYTHON=python3` opts into the active interpreter instead.
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
PY_DEPS := $(if $(filter $(VENV)/bin/python,$(PYTHON)),$(VENV)/bin/python)
CMAKE_FLAGS ?=
GPU := $(shell nvidia-smi -L >/dev/null 2>&1 && echo 1)
CTEST_LABELS := cpu|jit|hip$(if $(GPU),|gpu,)

# Sanitizer and fuzz builds live in their own directories so they never mix with the release build.
SAN_BUILD ?= build-asan
SAN_CXX ?= g++
FUZZ_BUILD ?= build-fuzz
FUZZ_CXX ?= clang++
FUZZ_SECONDS ?= 120
# -O1 with debug info and assertions on (no NDEBUG): fast enough for the CPU suites, exact stack traces.
SAN_CMAKE := -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
             -DFLASHPORT_SANITIZE=address,undefined -DFLASHPORT_BUILD_BENCH=OFF $(CMAKE_FLAGS)
SAN_ENV := UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_stack_use_after_return=1:strict_init_order=1
# CPython is not instrumented: the sanitizer runtimes must be loaded first (LD_PRELOAD), and its
# interpreter-lifetime allocations would all be reported as leaks (detect_leaks=0).
SAN_PY_ENV := LD_PRELOAD="$$($(SAN_CXX) -print-file-name=libasan.so) $$($(SAN_CXX) -print-file-name=libubsan.so)" \
              UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ASAN_OPTIONS=detect_leaks=0 PYTHONMALLOC=malloc

.PHONY: all build demo test test-cpp test-python test-emu bench prebuild format check-format install clean hip \
        test-sanitize test-sanitize-cpp test-sanitize-python fuzz

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

# Opt-in: the forward-side GPU tests (and the fp32 backward's) on the CPU emulator of the portable CUDA
# kernels (tests/gpu/emu; needs the CUDA toolkit, no GPU; about 3 minutes on 2 cores). Registers ctest label emu in $(BUILD).
test-emu: $(BUILD)/build.ninja
	cmake -S . -B $(BUILD) -DFLASHPORT_GPU_EMU=ON
	cmake --build $(BUILD) -j $(JOBS)
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L emu

$(VENV)/bin/python:
	python3 -m venv --system-site-packages $(VENV)
	$(VENV)/bin/python -m pip install -q --disable-pip-version-check nanobind scikit-build-core numpy pytest

test-python: $(PY_DEPS)
	$(PYTHON) -m pip install -q --disable-pip-version-check --no-build-isolation .
	$(PYTHON) -m pytest -q tests/python

bench: build $(PY_DEPS)
	$(BUILD)/bench/flashport_bench --out $(BUILD)/bench_flashport.jsonl
	$(PYTHON) bench/peer_torch.py $(BUILD)/bench_flashport.jsonl
	$(BUILD)/bench/flashport_bench --decode --out $(BUILD)/bench_decode.jsonl
	$(PYTHON) bench/peer_torch.py $(BUILD)/bench_decode.jsonl

# AMD (issue #17): turns FLASHPORT_HIP on in $(BUILD), compiles every HIP kernel variant for gfx90a and
# gfx942 with the code-object checks (cmake/hip_kernels.cmake; needs hipcc, libamdhip64-dev, clang-19,
# lld-19), then runs the kernels on the CPU wave64 model (label hip). No AMD GPU is needed or used.
hip: $(BUILD)/build.ninja
	cmake -S . -B $(BUILD) -DFLASHPORT_HIP=ON
	cmake --build $(BUILD) -j $(JOBS) --target hip_kernels flashport_tests_hip flashport_tests_hip_backend
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L hip

prebuild: build
	cmake --build $(BUILD) --target prebuild

install: build
	cmake --install $(BUILD) --prefix $(or $(PREFIX),/usr/local)

# clang-format-14 (what CI checks with scripts/check_format.sh; other versions format differently).
format:
	git ls-files '*.c' '*.cc' '*.cpp' '*.cxx' '*.h' '*.hh' '*.hpp' '*.cu' '*.cuh' | xargs clang-format-14 -i

check-format:
	scripts/check_format.sh

# --- sanitizers and fuzzing (README "Sanitizers and fuzzing") --------------------------------------
$(SAN_BUILD)/build.ninja:
	cmake -S . -B $(SAN_BUILD) -DCMAKE_CXX_COMPILER=$(SAN_CXX) $(SAN_CMAKE)

test-sanitize: test-sanitize-cpp test-sanitize-python

# cpu and jit labels (jit: the NVRTC compile checks, about a minute once `make test` has filled the
# kernel cache; nothing when the CUDA toolkit is absent). A test that fails only because LeakSanitizer's
# tracer crashed at its exit (a tool flake) is rerun once: scripts/ctest_lsan_retry.sh.
test-sanitize-cpp: $(SAN_BUILD)/build.ninja
	cmake --build $(SAN_BUILD) -j $(JOBS) --target flashport_host_tests
	cd $(SAN_BUILD) && $(SAN_ENV) $(CURDIR)/scripts/ctest_lsan_retry.sh --output-on-failure -j $(JOBS) -L "cpu|jit"

# The whole Python suite against the sanitized extension, staged with the package in pyroot (ahead of
# any installed flashport on PYTHONPATH). torch's tests run too when torch imports (about 35 s under
# ASan with torch 2.15, no reports from its uninstrumented libraries); SAN_NO_TORCH=1 hides torch
# (its import raises ImportError, so only the numpy-path tests run) for a torch that misbehaves there.
test-sanitize-python: $(SAN_BUILD)/build.ninja $(PY_DEPS)
	cmake -S . -B $(SAN_BUILD) -DFLASHPORT_BUILD_PYTHON=ON -DPython_EXECUTABLE="$$(command -v $(PYTHON))"
	cmake --build $(SAN_BUILD) -j $(JOBS) --target _C
	rm -rf $(SAN_BUILD)/pyroot && mkdir -p $(SAN_BUILD)/pyroot
	cp -r python/flashport $(SAN_BUILD)/pyroot/ && cp $(SAN_BUILD)/python/_C*.so $(SAN_BUILD)/pyroot/flashport/
	$(SAN_PY_ENV) PYTHONPATH=$(CURDIR)/$(SAN_BUILD)/pyroot $(PYTHON) -c "import sys; \
	  sys.modules.update({'torch': None} if '$(SAN_NO_TORCH)' == '1' else {}); \
	  import pytest; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'tests/python']))"

# CPU only: the fuzzer calls the CPU backend, so the CUDA backend would only add build time.
$(FUZZ_BUILD)/build.ninja:
	cmake -S . -B $(FUZZ_BUILD) -DCMAKE_CXX_COMPILER=$(FUZZ_CXX) $(SAN_CMAKE) -DFLASHPORT_FUZZ=ON -DFLASHPORT_WITH_CUDA=OFF \
	  -DFLASHPORT_BUILD_TESTS=OFF

# Runs the fuzzer for FUZZ_SECONDS on a copy of the committed corpus; fails on the first crash, leaving
# the input as $(FUZZ_BUILD)/crash-<sha1>. One OpenMP thread: the calls are tiny, so thread wake-ups
# would dominate each execution.
fuzz: $(FUZZ_BUILD)/build.ninja
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target fuzz_validation
	mkdir -p $(FUZZ_BUILD)/corpus && cp tests/fuzz/corpus/* $(FUZZ_BUILD)/corpus/
	$(SAN_ENV) OMP_NUM_THREADS=1 $(FUZZ_BUILD)/tests/fuzz/fuzz_validation -max_total_time=$(FUZZ_SECONDS) -timeout=20 \
	  -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/ $(FUZZ_BUILD)/corpus

clean:
	rm -rf $(BUILD) $(SAN_BUILD) $(FUZZ_BUILD) $(VENV)
