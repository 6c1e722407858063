# The character-level GPT in mmengine's new config style: `read_base()` and real imports,
# which shardwise reads as mmengine 0.10 does (no mmengine needed):
#   shardwise train examples/gpt_lazy.py --cfg-options train_cfg.max_iters=100
from mmengine.config import read_base

with read_base():
    from .gpt_base import *  # noqa: F403

from chargpt import CharGPT  # beside this file; imported when the model is built
from torch.optim import AdamW

from shardwise.strategies import SingleDeviceStrategy

model.update(type=CharGPT)  # noqa: F405
optim_wrapper.optimizer.update(type=AdamW)  # noqa: F405
strategy = dict(type=SingleDeviceStrategy)
