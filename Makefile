# w4: `make demo` and `make test` work from a fresh clone, outside any venv.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# the GPU machine's own interpreter, which already holds CUDA torch
GPU_PYTHON ?= python3
# llama-cpp-python (the tests' llama.cpp) builds llama.cpp from source: only the library the tests
# load (no multimodal library, tools, examples or server: about 4 minutes on 2 cores instead of 8),
# for any AVX2 machine rather than this CPU alone, so pip's cached wheel stays usable elsewhere
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF

.PHONY: all demo test test-gpu kernels-check bench-stream bench-gguf bench-tensors clean

all: test

# On a machine without an NVIDIA GPU, torch's CPU build goes in first, so pip never pulls several
# GB of CUDA wheels: a local CPU wheel if pip can find one, else PyTorch's CPU index.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(BIN)/pip install -q torch; \
	else \
		$(BIN)/pip install -q "torch==2.13.0+cpu" 2>/dev/null \
		|| $(BIN)/pip install -q torch --index-url https://download.pytorch.org/whl/cpu; \
	fi
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip install -q -e '.[test]'
	touch $@

demo: $(STAMP)
	rm -rf demo
	$(BIN)/python -m w4cli.demo demo
	HF_HUB_OFFLINE=1 $(BIN)/w4 dequantize w4-demo/tiny-llama-awq demo/dense --cache-dir demo/hub
	HF_HUB_OFFLINE=1 $(BIN)/w4 verify demo/dense --against w4-demo/tiny-llama-awq --cache-dir demo/hub

test: $(STAMP)
	@if command -v nvcc >/dev/null 2>&1; then $(MAKE) --no-print-directory kernels-check; \
	else echo "nvcc not on PATH: skipping kernels-check"; fi
	$(BIN)/python -m pytest

# on a machine with a CUDA GPU and its own torch (the device machine): the GPU-marked tests, which
# live in tests/*_gpu.py (only those are collected: that machine need not have the CPU tests' packages)
test-gpu:
	$(GPU_PYTHON) -m pytest -m gpu -rA tests/*_gpu.py

# one line per kernel file and arch; V=1 lists every kernel's registers and spills
kernels-check:
	V=$(V) bash kernels/check.sh

# streaming memory and throughput on a synthetic Llama-7B-shaped checkpoint (docs/performance.md)
bench-stream: $(STAMP)
	$(BIN)/python tests/perf_dequantize_stream.py

# time and memory of w4 gguf against w4 dequantize on the same 7B-shaped AWQ checkpoint (docs/performance.md)
bench-gguf: $(STAMP)
	$(BIN)/python tests/perf_gguf_stream.py

# time and memory of dequantize and verify on 100,000 small tensors (an MoE's count; docs/performance.md)
bench-tensors: $(STAMP)
	$(BIN)/python tests/perf_many_tensors.py

clean:
	rm -rf $(VENV) demo build *.egg-info
