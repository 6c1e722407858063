import math
import os.path as osp
from functools import partial

import torch  # a third-party import: the config is a lazy one

root = osp.join("data", "coco")
scale = math.sqrt(16)
half = partial(max, 0)(-1)
act = dict(type=torch.nn.ReLU)
