"""``make gpu-check`` cannot rot where CI has no GPU: its CPU dry run passes every case, the
bench gives every figure, and the results render into bench/RESULTS.md's GPU section."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.distributed import REPO

#: What the gpu cases must cover (a fragment of each case's name).
COVERED = [
    "[SingleDeviceStrategy]",
    "[DDPStrategy]",
    "[FSDPStrategy]",
    "bf16_with_its_parameters_offloaded",
    "reduced_precision[float16]",
    "reduced_precision[bfloat16]",
    "torch_compile_under_fsdp",
    "tensor_parallel_on_a_one_rank_mesh",
    "async_save_stages_into_pinned_host_memory",
    "resumes_on_the_other_device[gpu_to_cpu",
    "resumes_on_the_other_device[cpu_to_gpu",
    "random_state_bit_exactly",
    "gpt_example",
]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_gpu_check_dry_run_passes_every_case_and_gives_every_figure(tmp_path):
    out = tmp_path / "gpu_check_results.json"
    env = {**os.environ, "SHARDWISE_GPU_CHECK_ON_CPU": "1", "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "gpu_check.py"), "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=850,
    )
    assert proc.returncode == 0, f"{proc.stdout[-5000:]}\n{proc.stderr[-3000:]}"
    result = json.loads(out.read_text())
    assert result["ok"] and result["dry_run"]
    tests = result["tests"]
    names = [case["case"] for case in tests["cases"]]
    assert not tests["timed_out"] and tests["returncode"] == 0
    assert [c for c in tests["cases"] if c["outcome"] != "passed"] == []
    missing = [fragment for fragment in COVERED if not any(fragment in n for n in names)]
    assert not missing, f"no gpu case covers {missing}; cases: {names}"

    bench = result["bench"]
    assert bench["status"] == "ok" and bench["dry_run"] and result["missing_figures"] == []
    assert set(bench["step_s"]) == {"shardwise", "raw"} and bench["step_ratio"] > 0
    assert set(bench["checkpoint_runs_s"]) >= {"sync", "async blocked", "torch.save"}
    assert 0 < bench["async_blocking_ratio"]
    assert set(bench["met"]) == {"mfu", "step_ratio", "async_blocking_ratio", "peak_memory_ratio"}
    assert set(bench["met"].values()) == {None}  # a dry run meets or misses no target

    markdown = out.with_suffix(".md").read_text()
    assert markdown.startswith("## 6. GPU (bench/gpu.py)") and "CPU dry run" in markdown
    assert all(name in markdown for name in names)
    assert out.with_suffix(".pytest.log").read_text().strip()

    # the rendering replaces the GPU section of RESULTS.md and nothing else; a dry run only
    # when asked (it is not figures)
    results_md = tmp_path / "RESULTS.md"
    original = (REPO / "bench" / "RESULTS.md").read_text()
    results_md.write_text(original)
    render = [
        sys.executable,
        str(REPO / "bench" / "gpu_check.py"),
        "--render-into",
        str(results_md),
        "--results",
        str(out),
    ]
    refused = subprocess.run(render, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0 and "dry run" in refused.stderr
    assert results_md.read_text() == original
    subprocess.run([*render, "--allow-dry-run"], cwd=REPO, check=True, timeout=120)
    rendered = results_md.read_text()
    before, after = original.split("## 6. GPU (bench/gpu.py)")
    assert rendered.startswith(before) and markdown in rendered
    assert rendered.endswith(after[after.index("\n## ") + 1 :])
