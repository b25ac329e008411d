# baton - thin wrapper over CMake.  On a fresh Debian 12 machine:
#   make demo   installs missing packages, builds, serves a real model
#   make test   installs missing packages, builds, runs every test (ctest),
#               then the unit tests again under AddressSanitizer + UBSan
JOBS ?= $(shell nproc)
BUILD ?= build
ASAN_BUILD ?= build-asan
CMAKE_FLAGS ?=
SHARED ?= $(abspath ../shared)

DEB_PACKAGES = build-essential cmake pkg-config git clang \
  libcjson-dev libzmq3-dev libprotobuf-c-dev protobuf-c-compiler \
  libucx-dev libpcre2-dev libutf8proc-dev python3 python3-yaml \
  slurmctld slurmd slurm-client munge nodejs prometheus \
  libmicrohttpd-dev openssl curl
SUDO = $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: all deps build build-asan test test-asan demo fuzz clean format chaos

all: build

deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
	  dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  $(SUDO) apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -qq $$missing; \
	fi

build: deps
	cmake -S . -B $(BUILD) -DBT_WERROR=ON $(CMAKE_FLAGS)
	cmake --build $(BUILD) -j$(JOBS)

build-asan: deps
	cmake -S . -B $(ASAN_BUILD) -DBT_WERROR=ON -DBATON_CUDA=OFF \
	  -DBT_ASAN=ON -DBT_UBSAN=ON -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_C_FLAGS_DEBUG="-O1 -g" $(CMAKE_FLAGS)
	cmake --build $(ASAN_BUILD) -j$(JOBS)

# Everything, then the fast unit tests once more under ASan + UBSan.
test: build build-asan
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)
	cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 \
	  UBSAN_OPTIONS=print_stacktrace=1 \
	  ctest --output-on-failure -j$(JOBS) -LE slow

demo: build
	bash deploy/demo.sh $(BUILD)/bin $(SHARED)/models

# libFuzzer for FUZZ_SECONDS per target (clang), from the seeds in
# tests/fuzz/corpus/NAME; what it finds goes to build-fuzz/corpus/NAME
# (keep it: build-fuzz/fuzz/NAME -merge=1 tests/fuzz/corpus/NAME
# build-fuzz/corpus/NAME adds the inputs that reach new code).
FUZZ_SECONDS ?= 60
fuzz: deps
	CC=clang cmake -S . -B build-fuzz -DBT_FUZZ=ON -DBATON_CUDA=OFF
	cmake --build build-fuzz -j$(JOBS)
	for f in build-fuzz/fuzz/fuzz_*; do n=$$(basename $$f); \
	  mkdir -p tests/fuzz/artifacts build-fuzz/corpus/$$n; \
	  $$f -max_total_time=$(FUZZ_SECONDS) -artifact_prefix=tests/fuzz/artifacts/ \
	    build-fuzz/corpus/$$n tests/fuzz/corpus/$$n || exit 1; done

# The fault suite (issue 35, tests/chaos/README.md): real clusters on
# 127.0.0.1, one fault per row, one table (also $(BUILD)/chaos/
# chaos-table.md); nonzero when a row has a wrong or hung request or
# misses its bound.  CHAOS_SOAK_S shortens the 30-minute soak;
# CHAOS_ARGS="--bounded" is CI's form, CHAOS_ARGS="--rows a,b" picks rows.
CHAOS_SOAK_S ?=
CHAOS_ARGS ?=
chaos: build
	python3 tests/chaos/chaos.py --bin $(BUILD)/bin \
	  --tools $(BUILD)/tests/chaos --models $(SHARED)/models \
	  --out $(BUILD)/chaos $(if $(CHAOS_SOAK_S),--soak-s $(CHAOS_SOAK_S)) \
	  $(CHAOS_ARGS)

format:
	find common worker client router prefill decode gateway tests -name '*.[ch]' \
	  -o -name '*.cu' | xargs clang-format -i

clean:
	rm -rf $(BUILD) $(ASAN_BUILD) build-fuzz

# GPU tests and benchmark (CUDA backend, issue 4).  They run ON THE DEVICE
# MACHINE from a carried build and never rebuild; logs and result tables
# go to $OUT when set (see docs/PERFORMANCE.md).  Here: `make gpu-carry`
# builds build-cuda for Hopper and packs their binaries, the libraries
# the device lacks and the models into .carry/ (under the 64 MiB carry
# limit); then the device call
#   run(carry=[".carry"], command="bash .carry/call.sh")
# runs both there (tests/gpu/run_gpu_make.sh).
GPU_BUILD ?= build-cuda
GPU_TESTS = $(shell bash tests/gpu/run_gpu_test.sh --list) bench_cuda
.PHONY: gpu-test gpu-bench gpu-carry
gpu-carry: deps
	cmake -S . -B build-cuda -DBT_WERROR=ON -DCMAKE_BUILD_TYPE=Release \
	  -DCMAKE_CUDA_ARCHITECTURES=90a $(CMAKE_FLAGS)
	cmake --build build-cuda -j$(JOBS)
	bash tests/gpu/pack_carry.sh gpumake tests/gpu/run_gpu_make.sh \
	  $(GPU_TESTS:%=gpu/%) shared
gpu-test:
	bash tests/gpu/run_gpu_test.sh $(GPU_BUILD)
gpu-bench:
	bash tests/gpu/run_gpu_bench.sh $(GPU_BUILD)
