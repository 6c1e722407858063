# ruff: noqa: F403, F405  (a config: names come from its base configs)
import torch
from mmengine.config import read_base
from torch.optim import AdamW

with read_base():
    from ._base_.model import model as base_model
    from ._base_.runtime import *

optim_wrapper.optimizer.type = AdamW
optim_wrapper.optimizer.lr = 1e-3
train_cfg.update(max_epochs=20)
model = dict(base_model, out_features=3)
extra = dict(type=torch.nn.GELU, sizes=(1, 2))
