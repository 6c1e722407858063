"""Real OpenMMLab configs (mmpretrain, mmocr; the shared corpus) read as mmengine reads them.

The comparison is the project's tool ``shared/tools/config_parity.py``: each file read by
mmengine's ``Config.fromfile`` and by shardwise's, ``to_dict()`` compared type for type. The
default suite checks a few files that exercise each rule; ``-m slow`` checks every file.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

SHARED = Path(os.environ.get("SHARDWISE_SHARED", Path(__file__).parents[2] / "shared"))
TOOL = SHARED / "tools" / "config_parity.py"
CORPUS = SHARED / "corpus" / "openmmlab-configs"

pytestmark = pytest.mark.skipif(
    not (TOOL.is_file() and CORPUS.is_dir()),
    reason=f"the parity tool and the config corpus are not here ({SHARED}; set SHARDWISE_SHARED)",
)

# one file per rule the reading must get right
SAMPLES = {
    "mmocr/configs/textrecog/crnn/crnn_mini-vgg_5e_toy.py": "_base_.x.update(...) in the leaf",
    "mmocr/configs/textdet/dbnet/dbnet_resnet50-oclip_1200e_icdar2015.py": "_base_ assignment",
    "mmocr/configs/textdet/dbnet/dbnet_resnet50_1200e_icdar2015.py": "base field set by leaf",
    "mmocr/configs/textrecog/svtr/svtr-small_20e_st_mj.py": "{{ fileDirname }}",
    "mmpretrain/configs/mobileone/mobileone-s1_8xb32_in1k.py": "dicts copied into a base",
    "mmpretrain/configs/resnest/resnest50_32xb64_in1k.py": "{{_base_.x}}, a list",
    "mmpretrain/configs/arcface/resnet50-arcface_8xb32_inshop.py": "{{_base_.x}}, a dict",
    "mmpretrain/mmpretrain/configs/resnet/resnet18_8xb32_in1k.py": "read_base(), lazy imports",
    "mmpretrain/mmpretrain/configs/mae/mae_vit_base_p16_8xb512_amp_coslr_300e_in1k.py": "lazy",
}


def _tool():
    pytest.importorskip("mmengine", reason="mmengine is the oracle of the comparison")
    spec = importlib.util.spec_from_file_location("config_parity", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("relative", SAMPLES, ids=list(SAMPLES.values()))
def test_openmmlab_config_reads_as_mmengine_reads_it(relative):
    status, detail = _tool().check(CORPUS / relative)
    assert status == "same", detail


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_every_corpus_config_reads_as_mmengine_reads_it():
    _tool()  # skips without mmengine
    result = subprocess.run(
        [sys.executable, str(TOOL), str(CORPUS), "--show", "20"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
