"""``DeepSpeedOptimWrapper``: mmengine's name for the optimizer wrapper of a DeepSpeed run.

Under :class:`~shardwise.strategies.DeepSpeedStrategy` the name is a placeholder: the strategy
builds an :class:`OptimWrapper` or, for ``fp16``/``amp``, an
:class:`~shardwise.optim.AmpOptimWrapper`, with the DeepSpeed config's clipping and gradient
accumulation (see :func:`~shardwise.strategies.deepspeed.translate_optim_wrapper`). Built
directly (another strategy, or the config check), it is a plain :class:`OptimWrapper`.

Example::

    optim_wrapper = dict(type='DeepSpeedOptimWrapper', optimizer=dict(type='AdamW', lr=1e-4))
"""

from __future__ import annotations

from ..registry import OPTIM_WRAPPERS
from .optim_wrapper import OptimWrapper

__all__ = ["DeepSpeedOptimWrapper"]


@OPTIM_WRAPPERS.register_module()
class DeepSpeedOptimWrapper(OptimWrapper):
    """mmengine's ``DeepSpeedOptimWrapper`` name: an :class:`OptimWrapper` (its arguments:
    ``optimizer``, ``accumulative_counts``, ``clip_grad``). DeepSpeedStrategy replaces it by
    the wrapper its DeepSpeed config asks for."""
