# k3c build. `make` builds the library, the CLI (build/k3c) and the tests; CUDA parts are
# built wherever nvcc is found (NVCC=... overrides, NVCC= disables) and skipped cleanly elsewhere.
#
#   make            build/k3c and build/test_k3c
#   make test       build and run the CPU tests (what .ci/run runs)
#   make gpu-test   build the GPU test binary (build/test_gpu); tools/gpu-check.sh runs it
#   make fuzz       build the libFuzzer targets with ASan+UBSan and run each for a bounded time
#   make deps       install the Debian packages k3c needs (root)

CC      ?= cc
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= $(patsubst %/bin/nvcc,%,$(NVCC))
BUILD   ?= build

# -march: the CPU kernels use AVX2/AVX-512 where the compiler targets them, a portable path elsewhere.
ARCHFLAGS ?= -march=native
CFLAGS  ?= -O2 -g
# override: CFLAGS/LDLIBS given on the command line (e.g. sanitizer flags) are extended, not replaced.
override CFLAGS  += -std=gnu11 -Wall -Wextra -Wno-unused-parameter -Werror=implicit-function-declaration \
           -fno-strict-aliasing -pthread $(ARCHFLAGS) -Iinclude -Isrc -MMD -MP
override LDLIBS  += -lcjson -lpcre2-8 -lm -pthread

LIB_SRC  := $(shell find src -name '*.c' -not -path 'src/cli/*' | sort)
CLI_SRC  := $(shell find src/cli -name '*.c' | sort)
TEST_SRC := $(shell find tests -maxdepth 2 -name '*.c' -not -path 'tests/gpu/*' -not -path 'tests/fuzz/*' | sort)
CU_SRC   := $(shell find src/cuda -name '*.cu' 2>/dev/null | sort)
GPU_TEST_SRC := $(shell find tests/gpu -name '*.c' -not -name 'bench_*' 2>/dev/null | sort)

ifneq ($(strip $(NVCC)),)
HAVE_CUDA := 1
NVCCFLAGS ?= -O3 -lineinfo
override NVCCFLAGS += -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Iinclude -Isrc \
             -Xcompiler -Wall,-Wno-unused-parameter -Werror all-warnings -MMD -MP
override CFLAGS  += -DK3C_HAVE_CUDA=1 -I$(CUDA_HOME)/include
# cudart static: the CLI runs (on the CPU) on machines with the toolkit but no driver or GPU.
override LDLIBS  += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcublas -lcudart_static -ldl -lrt
CU_OBJ  := $(CU_SRC:%.cu=$(BUILD)/%.o)
else
CU_OBJ  :=
endif

LIB_OBJ  := $(LIB_SRC:%.c=$(BUILD)/%.o)
CLI_OBJ  := $(CLI_SRC:%.c=$(BUILD)/%.o)
TEST_OBJ := $(TEST_SRC:%.c=$(BUILD)/%.o)
GPU_TEST_OBJ := $(GPU_TEST_SRC:%.c=$(BUILD)/%.o)
LIB      := $(BUILD)/libk3c.a

.PHONY: all test gpu-test fuzz fuzz-deps fuzz-load clean deps
all: $(BUILD)/k3c $(BUILD)/test_k3c

$(LIB): $(LIB_OBJ) $(CU_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/k3c: $(CLI_OBJ) $(LIB)
	$(CC) $(CFLAGS) -o $@ $(CLI_OBJ) $(LIB) $(LDLIBS) $(if $(HAVE_CUDA),-lstdc++)

$(BUILD)/test_k3c: $(TEST_OBJ) $(LIB)
	$(CC) $(CFLAGS) -o $@ $(TEST_OBJ) $(LIB) $(LDLIBS) $(if $(HAVE_CUDA),-lstdc++)

$(BUILD)/test_gpu: $(GPU_TEST_OBJ) $(BUILD)/tests/test_main.o $(LIB)
	$(CC) $(CFLAGS) -o $@ $(GPU_TEST_OBJ) $(BUILD)/tests/test_main.o $(LIB) $(LDLIBS) -lstdc++

# GPU kernel benchmark (tools/gpu-check.sh runs it): bandwidth of the big kernels vs a measured copy.
$(BUILD)/bench_gpu: $(BUILD)/tests/gpu/bench_gpu.o $(LIB)
	$(CC) $(CFLAGS) -o $@ $(BUILD)/tests/gpu/bench_gpu.o $(LIB) $(LDLIBS) -lstdc++

# the default tokenizer's ranks are assembled into this object (.incbin)
$(BUILD)/src/text/tokenizer_default.o: src/text/data/default-32512.tiktoken

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -c $< -o $@

# where nvcc is, the GPU test and benchmark programs are built too (not run: CI has no GPU), so that a
# change that breaks them fails here and not on the GPU host
test: $(BUILD)/k3c $(BUILD)/test_k3c $(if $(HAVE_CUDA),$(BUILD)/test_gpu $(BUILD)/bench_gpu)
	$(BUILD)/test_k3c

gpu-test: $(BUILD)/k3c $(BUILD)/test_gpu $(BUILD)/bench_gpu

# libFuzzer targets: clang with ASan + UBSan over the parsers of untrusted input. New inputs go to
# $(BUILD)/fuzz/corpus_* (the checked-in seeds under tests/fuzz/ are read, never written); a crash leaves
# its input as $(BUILD)/fuzz/crash-*. `make fuzz-deps` installs clang and its fuzzer runtime (root).
FUZZ_CC    ?= clang
FUZZ_FLAGS := -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all -Iinclude -Isrc -pthread
FUZZ_LIB   := src/util/error.c src/format/safetensors.c src/format/index.c src/format/dtype.c src/format/json_kind.c
FUZZ_SECONDS ?= 30
FUZZ_RUN    = -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -print_final_stats=1 -artifact_prefix=$(BUILD)/fuzz/
fuzz:
	@mkdir -p $(BUILD)/fuzz/corpus_safetensors $(BUILD)/fuzz/corpus_index
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $(BUILD)/fuzz/fuzz_safetensors tests/fuzz/fuzz_safetensors.c $(FUZZ_LIB) -lcjson -lm
	$(FUZZ_CC) $(FUZZ_FLAGS) -o $(BUILD)/fuzz/fuzz_index tests/fuzz/fuzz_index.c $(FUZZ_LIB) -lcjson -lm
	$(BUILD)/fuzz/fuzz_safetensors $(FUZZ_RUN) -dict=tests/fuzz/safetensors.dict \
	    $(BUILD)/fuzz/corpus_safetensors tests/fuzz/corpus_safetensors
	$(BUILD)/fuzz/fuzz_index $(FUZZ_RUN) -dict=tests/fuzz/index.dict $(BUILD)/fuzz/corpus_index tests/fuzz/corpus_index

fuzz-deps:
	apt-get update -qq && apt-get install -y -qq clang libclang-rt-14-dev

# Whole-checkpoint mutations (config values, shard headers and lengths, the index) loaded end to end by an
# ASan + UBSan build of the CLI (build-asan, CPU only): tools/fuzz_load.py. FUZZ_LOAD_N iterations, a fresh
# seed each run (printed; FUZZ_LOAD_SEED replays one).
FUZZ_LOAD_N ?= 500
fuzz-load:
	$(MAKE) BUILD=build-asan NVCC= CFLAGS="-O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer" \
	    build-asan/k3c
	python3 tools/fuzz_load.py --k3c build-asan/k3c --iterations $(FUZZ_LOAD_N) \
	    $(if $(FUZZ_LOAD_SEED),--seed $(FUZZ_LOAD_SEED))

deps:
	apt-get update -qq && apt-get install -y -qq libcjson-dev libpcre2-dev

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
