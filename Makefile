# shardwise: every set-up step lives here.  `make train` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  := torch==2.13.0
NPROC  ?= 2

.PHONY: install test-install openmmlab mmcv-ops train test test-quick test-slow lint bench gpu-check clean

# The install step pins torch first: an unpinned `torch` would pull the CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(TORCH)
	$(PIP) install --quiet -e '.[all]' $(TORCH)
	touch $@

# Test-only dependencies (pytest, ruff, and the oracles the tests compare with: mmengine 0.10.7,
# transformers; Ray Train for tests/test_ray.py's local cluster, about 20 s and 500 MB; the
# trackers the tests read back, wandb and mlflow-skinny; torchft for the fault-tolerance tests;
# moto's S3 server and the s3fs client for the object-storage tests):
# installed by the test commands, never needed to import shardwise or to train.
$(VENV)/.test-installed: $(VENV)/.installed pyproject.toml
	$(PIP) install --quiet -e '.[test,all]' $(TORCH)
	touch $@

# OpenMMLab beside shardwise (README, "Training an OpenMMLab project"): mmengine 0.10.7, mmcv-lite
# 2.2.0 (mmcv without its compiled ops; the full mmcv's source does not build), mmpretrain 1.2.0,
# torchvision 0.28.0, into the venv, the venv's torch kept; where pip's torchvision is another build
# than torch (CUDA beside the CPU torch), its compiled ops are removed (tools/openmmlab_env.sh says why).
$(VENV)/.openmmlab: $(VENV)/.installed tools/openmmlab_env.sh
	PYTHON=$(PY) bash tools/openmmlab_env.sh
	touch $@

# mmcv 2.1.0 with its compiled CPU ops (mmdetection 3.3.0, mmsegmentation 1.2.2, mmpose and mmocr
# need them; mmcv-lite has none) in place of mmcv-lite: the wheel is built once for this torch and
# python into MMCV_CACHE, outside the repository (23 CPU-minutes; 54 minutes on 2 busy cores), then
# installed (seconds), with mmdetection 3.3.0 and mmsegmentation 1.2.2 (tools/openmmlab_ops_env.sh).
MMCV_CACHE ?= $(HOME)/.cache/shardwise
$(VENV)/.mmcv-ops: $(VENV)/.openmmlab tools/build_mmcv_ops.sh tools/openmmlab_ops_env.sh
	MMCV_CACHE=$(MMCV_CACHE) PYTHON=$(PY) bash tools/openmmlab_ops_env.sh
	touch $@

install: $(VENV)/.installed
test-install: $(VENV)/.test-installed
openmmlab: $(VENV)/.openmmlab
mmcv-ops: $(VENV)/.mmcv-ops

# The main job: a character-level GPT on the standard library's source, FSDP2 on 2 CPU ranks.
train: install
	$(VENV)/bin/shardwise train examples/gpt_fsdp.py --nproc-per-node $(NPROC) --work-dir work_dirs/gpt

lint: test-install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check --quiet src tests bench examples

test: lint
	$(PY) -m pytest -q

# A quick subset (under 2 minutes on 2 cores, where `make test` takes about 7): the
# quickstart on one process and under torchrun, the README's paths, configs, registries,
# optimizer wrappers, the commit protocol and the full checkpoint format.
QUICK_TESTS := tests/test_quickstart.py tests/test_readme.py tests/test_config.py \
	tests/test_registry.py tests/test_optim_wrapper.py tests/test_commit.py tests/test_full_format.py
test-quick: test-install
	$(PY) -m pytest -q $(QUICK_TESTS)

test-slow: test-install
	$(PY) -m pytest -q -m slow || [ $$? -eq 5 ]  # 5: no slow case collected

# Lightning (the peer) is a bench-only extra, pinned to the same torch.
bench: install
	$(PIP) install --quiet -e '.[bench]' $(TORCH)
	$(PY) bench/run_all.py --quick

# The CUDA path on one GPU (issue 31): `pytest -m gpu` and bench/gpu.py, into one results file
# (bench/gpu_check.py says how to run it on the device machine and render it into RESULTS.md).
# Installs nothing: the venv's python when there is one, else the machine's python3 (with its
# CUDA torch), shardwise from src/. SHARDWISE_GPU_CHECK_ON_CPU=1: the CPU dry run (CI runs it).
GPU_PYTHON ?= $(if $(wildcard $(PY)),$(PY),python3)
GPU_CHECK_OUT ?=
gpu-check:
	$(GPU_PYTHON) bench/gpu_check.py $(if $(GPU_CHECK_OUT),--out $(GPU_CHECK_OUT))

clean:
	rm -rf $(VENV) work_dirs .pytest_cache .ruff_cache
