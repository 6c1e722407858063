import torch.nn as nn
from torch.nn import Linear, ReLU

model = dict(type=Linear, in_features=4, out_features=2, act=dict(type=ReLU), norm=nn.BatchNorm1d)
