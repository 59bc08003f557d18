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

# Side-by-side benchmarks (release build; the peers come from Debian). Options via the
# environment, e.g. BENCH_QUICK=1 make bench; see bench/README.md.
bench: deps build
	@scripts/deps.sh s6 runit supervisor nginx wrk monit
	@MOTOR_BIN=$${MOTOR_BIN:-$(BUILD)/motor} /usr/bin/python3 bench/run.py

# Every fuzz target for FUZZ_SECONDS (default 60) each; FUZZ_ONLY=regex picks targets.
fuzz: test-build
	@scripts/fuzz-all.sh $(TEST_BUILD) $${FUZZ_SECONDS:-60} $${FUZZ_ONLY:-.}

# Fault injection against a local fleet under ASan (about 10 minutes; e.g.
# CHAOS_ARGS="--seed 7 --duration 1800"). A short run is part of `make test`. docs/chaos.md
chaos: test-build
	@MOTOR_BIN=$${MOTOR_BIN:-$(TEST_BUILD)/motor} /usr/bin/python3 tests/chaos/chaos.py $${CHAOS_ARGS:-}

clean:
	rm -rf $(BUILD) $(TEST_BUILD)

format:
	@clang-format -i $$(find src tests -name '*.[ch]')
