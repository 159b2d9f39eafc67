# Short wrappers around CMake so the README's commands stay short.
#   make           build (CPU; CUDA too when nvcc is present) into build/
#   make check     install dependencies, build with -Werror and run every test (CI runs this)
#   make asan      the same under AddressSanitizer + UndefinedBehaviorSanitizer, then make fuzz-ci
#   make fuzz-ci   every fuzz target for FUZZ_SECONDS (10) each with libFuzzer (clang)
#   make clang     the CPU build with clang and -Werror into build-clang/, then every test
#   make demo      install assets and fine-tune the default model (the README's first command)
JOBS ?= $(shell nproc)
CLANG ?= clang
BUILD ?= build
CMAKE_FLAGS ?=

.PHONY: all build check test asan fuzz-ci clang demo setup clean

all: build

build:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	cmake --build $(BUILD) -j $(JOBS)

setup:
	bash scripts/setup.sh

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

check: setup
	$(MAKE) test CMAKE_FLAGS="-DLT_WERROR=ON $(CMAKE_FLAGS)"

asan:
	$(MAKE) test BUILD=build-asan CMAKE_FLAGS="-DLT_WERROR=ON -DLT_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DLT_CUDA=OFF $(CMAKE_FLAGS)"
	$(MAKE) fuzz-ci

# Every libFuzzer target for FUZZ_SECONDS each (skipped, saying so, without clang's libFuzzer).
FUZZ_SECONDS ?= 10
fuzz-ci:
	bash scripts/fuzz-ci.sh $(FUZZ_SECONDS)

clang:
	$(MAKE) test BUILD=build-clang CC=$(CLANG) CMAKE_FLAGS="-DCMAKE_C_COMPILER=$(CLANG) -DLT_WERROR=ON -DLT_CUDA=OFF $(CMAKE_FLAGS)"

demo: setup build
	bash scripts/demo.sh

clean:
	rm -rf build build-asan build-clang
