# ruff: noqa: F403, F405  (a config: names come from its base configs)
from mmengine.config import read_base
from not_installed_pkg.models import Net

with read_base():
    from ._base_.runtime import *

model = dict(type=Net, depth=3)
