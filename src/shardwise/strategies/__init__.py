"""Strategies: where and how a model trains (one device, DDP, FSDP2; DeepSpeed configs on FSDP2)."""

from .base import BaseStrategy
from .ddp import DDPStrategy, ShardwiseDistributedDataParallel
from .deepspeed import DeepSpeedStrategy, deepspeed_to_fsdp
from .fsdp import FSDPStrategy, fully_shard_model, rebuild_optimizer
from .fsdp_config import FSDPConfig, parse_model_wrapper, parse_state_dict_cfg
from .mesh import Degrees, build_device_mesh, resolve_degrees
from .parallelize import (
    apply_activation_checkpointing,
    materialize_model,
    select_modules_to_shard,
)
from .single_device import SingleDeviceStrategy, revert_sync_batchnorm
from .tensor_parallel import ReplicateParallel, apply_tensor_parallel, parse_tp_plan, resolve_styles

__all__ = [
    "BaseStrategy",
    "SingleDeviceStrategy",
    "DDPStrategy",
    "FSDPStrategy",
    "DeepSpeedStrategy",
    "deepspeed_to_fsdp",
    "ShardwiseDistributedDataParallel",
    "FSDPConfig",
    "Degrees",
    "ReplicateParallel",
    "apply_tensor_parallel",
    "parse_tp_plan",
    "resolve_degrees",
    "resolve_styles",
    "apply_activation_checkpointing",
    "build_device_mesh",
    "fully_shard_model",
    "materialize_model",
    "parse_model_wrapper",
    "parse_state_dict_cfg",
    "rebuild_optimizer",
    "revert_sync_batchnorm",
    "select_modules_to_shard",
    "build_strategy",
]


def build_strategy(cfg):
    """Build a strategy from a config (``dict(type='DDPStrategy', ...)``) or return an
    already built one."""
    from shardwise.registry import STRATEGIES

    if isinstance(cfg, BaseStrategy):
        return cfg
    return STRATEGIES.build(cfg)
