# Thin wrapper: the real build is CMake + Ninja, the real test runner ctest.
BUILD      ?= build
TEST_BUILD ?= build-asan
JOBS       ?= $(shell nproc)
CONFIG     ?= examples/local.json

.PHONY: all deps build test test-build run fuzz bench chaos clean format

all: build

deps:
	@scripts/deps.sh

build:
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	@cmake --build $(BUILD) -j $(JOBS)

test-build: deps
	@cmake -S . -B $(TEST_BUILD) -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DCMAKE_C_COMPILER=clang -DMOTOR_SANITIZE=ON -DMOTOR_FUZZ=ON >/dev/null
	@cmake --build $(TEST_BUILD) -j $(JOBS)

test: deps test-build
	@scripts/check-banned.sh .
	@cd $(TEST_BUILD) && ctest --output-on-failure -j $(JOBS) --timeout 600

run: deps build
	@$(BUILD)/motor up -c $(CONFIG)

fuzz: test-build
	@cd $(TEST_BUILD) && ctest -L fuzz --output-on-failure -C fuzz-long

clean:
	rm -rf $(BUILD) $(TEST_BUILD)

format:
	@clang-format -i $$(find src tests -name '*.[ch]')
