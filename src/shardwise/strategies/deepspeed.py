"""DeepSpeedStrategy: DeepSpeed's configuration vocabulary, trained by FSDP2.

mmengine 0.10's ``DeepSpeedStrategy`` hands a DeepSpeed config (its constructor's keywords,
or a DeepSpeed JSON file or dict given as ``config=``) to ``deepspeed.initialize``. Here the
same config is translated, once, by the plain function :func:`deepspeed_to_fsdp` into
:class:`~shardwise.strategies.FSDPStrategy` keywords and ``optim_wrapper`` settings:

=====================================  ==================================================
DeepSpeed                              FSDP2 (shardwise)
=====================================  ==================================================
``zero_optimization.stage=3``          ``sharding_strategy='FULL_SHARD'``
``stage=2``                            ``'SHARD_GRAD_OP'`` (``reshard_after_forward=False``)
``stage=1``                            ``'SHARD_GRAD_OP'`` too (FSDP2 cannot shard only
                                       optimizer state; gradients are sharded as well)
``stage=0`` (the default)              ``'NO_SHARD'``
``mics_shard_size=N``                  ``parallelism=dict(dp_shard=N, dp_replicate=-1)``
``offload_optimizer/offload_param``    ``cpu_offload`` (``device='cpu'``; NVMe refused)
``bf16.enabled``                       ``mixed_precision=dict(param_dtype='bf16',
                                       reduce_dtype='fp32')``, ``OptimWrapper``
``fp16.enabled``                       the same in float16, ``AmpOptimWrapper`` (scaler)
``amp.enabled``                        ``AmpOptimWrapper(dtype='float16')`` (autocast)
``communication_data_type``            ``mixed_precision.reduce_dtype``
``gradient_clipping``                  ``clip_grad=dict(max_norm=...)``
``gradient_accumulation_steps``        ``accumulative_counts``
``train_micro_batch_size_per_gpu``     ``train_micro_batch_size_per_gpu`` (auto_scale_lr)
``train_batch_size``                   checked against micro batch x steps x world
``activation_checkpointing``           ``activation_checkpointing`` (needs ``check_fn``)
``optimizer`` section                  ``optim_wrapper.optimizer``
=====================================  ==================================================

A key that cannot be honoured is refused (``ValueError`` naming it, why, and the fix) when
not honouring it would change what trains or where memory goes; a tuning knob FSDP2 needs no
equivalent for is accepted and named in one warning with the reason. Both happen in
:meth:`DeepSpeedStrategy.check_config`, which ``shardwise train`` runs before any worker.

Example::

    strategy = dict(type='DeepSpeedStrategy', config='ds_config.json')  # or its keys:
    strategy = dict(type='DeepSpeedStrategy', zero_optimization=dict(stage=3),
                    bf16=dict(enabled=True), gradient_clipping=1.0,
                    gradient_accumulation_steps=4)
    optim_wrapper = dict(type='DeepSpeedOptimWrapper', optimizer=dict(type='AdamW', lr=1e-4))
"""

from __future__ import annotations

import copy
import difflib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from shardwise.optim.parts import SINGLE, optim_wrapper_parts
from shardwise.registry import STRATEGIES

from .fsdp import FSDPStrategy

__all__ = [
    "DeepSpeedStrategy",
    "DeepSpeedTranslation",
    "deepspeed_to_fsdp",
    "load_deepspeed_config",
]

logger = logging.getLogger(__name__)

#: mmengine 0.10.7's ``DeepSpeedStrategy`` keywords that are DeepSpeed config keys.
MMENGINE_CONFIG_KEYWORDS = (
    "zero_optimization",
    "gradient_clipping",
    "fp16",
    "bf16",
    "amp",
    "activation_checkpointing",
    "aio",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "steps_per_print",
)

# ---------------------------------------------------------------------------- key tables
#: Top-level keys accepted and not honoured: FSDP2 or shardwise needs no equivalent.
_IGNORED = {
    "steps_per_print": "DeepSpeed's own progress printing; shardwise's LoggerHook logs the run",
    "wall_clock_breakdown": "DeepSpeed's timers; the LoggerHook logs time and data_time",
    "memory_breakdown": "DeepSpeed's memory printing",
    "dump_state": "DeepSpeed's printing of its own state",
    "flops_profiler": "DeepSpeed's profiler; use torch.profiler",
    "tensorboard": "DeepSpeed's monitor; use the runner's visualizer",
    "wandb": "DeepSpeed's monitor; use the runner's visualizer",
    "csv_monitor": "DeepSpeed's monitor; use the runner's visualizer",
    "comet": "DeepSpeed's monitor; use the runner's visualizer",
    "comms_logger": "DeepSpeed's communication logger",
    "zero_allow_untested_optimizer": "FSDP2 shards any torch optimizer",
    "zero_force_ds_cpu_optimizer": "the optimizer named in optim_wrapper steps as given",
    "prescale_gradients": "FSDP2 divides the reduced gradients by the data-parallel size",
    "gradient_predivide_factor": "FSDP2 divides the reduced gradients by the data-parallel size",
    "fp32_allreduce": "gradients are reduced in float32 unless communication_data_type says "
    "otherwise",
    "aio": "it configures NVMe offload I/O, which FSDP2 does not do",
    "checkpoint": "DeepSpeed's checkpoint options; shardwise's sharded checkpoints reshard "
    "to any world size",
    "sparse_gradients": "FSDP2 reduces dense gradients",
    "disable_allgather": "FSDP2 gathers parameters itself",
    "seq_parallel_communication_data_type": "there is no sequence parallelism",
}

#: Top-level keys refused: not honouring them would change what trains.
_REFUSED = {
    "scheduler": "DeepSpeed's LR schedulers are not translated; give param_scheduler in "
    "mmengine's vocabulary, e.g. [dict(type='LinearLR', start_factor=0.01, by_epoch=False, "
    "end=1000), dict(type='CosineAnnealingLR', by_epoch=False, begin=1000)]",
    "sparse_attention": "it replaces the model's attention; FSDP2 trains the model as built",
    "compression_training": "it changes the model (quantisation, pruning); no FSDP2 counterpart",
    "quantize_training": "it changes the model's weights; no FSDP2 counterpart",
    "curriculum_learning": "it changes the data; no counterpart",
    "data_efficiency": "it changes the data; no counterpart",
    "progressive_layer_drop": "it changes the model; no counterpart",
    "eigenvalue": "it changes the schedule; no counterpart",
    "pipeline": "pipeline parallelism has no counterpart here; FSDPStrategy composes tensor "
    "and data parallelism (parallelism=dict(tp=...))",
    "elasticity": "it changes the batch size with the world size; no counterpart",
    "hybrid_engine": "DeepSpeed-Chat's inference engine; no counterpart",
    "autotuning": "DeepSpeed's autotuner launches trial runs; no counterpart",
    "nebula": "Azure's checkpoint service; no counterpart",
    "tensor_parallel": "DeepSpeed's AutoTP; use FSDPStrategy's parallelism=dict(tp=...) and "
    "tp_plan",
    "sequence_parallel_size": "there is no sequence parallelism",
}

#: Top-level keys translated (see :func:`deepspeed_to_fsdp`).
_TRANSLATED = {
    "zero_optimization",
    "gradient_clipping",
    "fp16",
    "bf16",
    "bfloat16",
    "amp",
    "activation_checkpointing",
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",
    "optimizer",
    "communication_data_type",
    "data_types",
}

_BUCKETS = "FSDP2 buckets, overlaps and prefetches communication per sharded module itself"
_UNITS = (
    "FSDP2 gathers per sharded module; choose the modules with "
    "model_wrapper=dict(auto_wrap_policy=...)"
)
_CHECKPOINTS = "shardwise's sharded checkpoints hold float32 weights and reshard to any world size"
_ZERO_IGNORED = {
    **dict.fromkeys(
        (
            "contiguous_gradients",
            "overlap_comm",
            "reduce_scatter",
            "reduce_bucket_size",
            "allgather_partitions",
            "allgather_bucket_size",
            "round_robin_gradients",
            "stage3_prefetch_bucket_size",
            "prefetch_bucket_size",
            "use_multi_rank_bucket_allreduce",
            "use_all_reduce_for_fetch_params",
        ),
        _BUCKETS,
    ),
    **dict.fromkeys(
        (
            "stage3_max_live_parameters",
            "max_live_parameters",
            "stage3_max_reuse_distance",
            "max_reuse_distance",
            "stage3_param_persistence_threshold",
            "param_persistence_threshold",
            "stage3_model_persistence_threshold",
            "model_persistence_threshold",
            "sub_group_size",
            "stage3_module_granularity_threshold",
            "module_granularity_threshold",
        ),
        _UNITS,
    ),
    **dict.fromkeys(
        (
            "stage3_gather_16bit_weights_on_model_save",
            "gather_16bit_weights_on_model_save",
            "stage3_gather_fp16_weights_on_model_save",
            "elastic_checkpoint",
            "load_from_fp32_weights",
            "pipeline_loading_checkpoint",
        ),
        _CHECKPOINTS,
    ),
    **dict.fromkeys(
        (
            "zero_quantized_weights",
            "zero_quantized_nontrainable_weights",
            "zero_quantized_gradients",
        ),
        "ZeRO++ quantised communication: FSDP2 communicates in the mixed-precision dtypes, "
        "unquantised",
    ),
    "zero_hpz_partition_size": "ZeRO++ secondary partitions: give FSDPStrategy's "
    "parallelism=dict(dp_replicate=..., dp_shard=...) for hybrid sharding",
    "mics_hierarchical_params_gather": "FSDP2 gathers over the shard dimension of the mesh",
    "ignore_unused_parameters": "FSDP2 does not require every parameter to get a gradient",
    "legacy_stage1": "stage 1 runs as FSDP2's SHARD_GRAD_OP",
    "memory_efficient_linear": "FSDP2 frees gathered parameters per sharded module",
    "override_module_apply": "FSDP2 does not patch Module.apply",
    "log_trace_cache_warnings": "DeepSpeed's tracing of stage 3 fetches",
    "zeropp_loco_param": "ZeRO++ quantised communication: FSDP2 communicates unquantised",
}
_ZERO_TRANSLATED = {
    "stage",
    "offload_optimizer",
    "offload_param",
    "cpu_offload",
    "cpu_offload_params",
    "cpu_offload_use_pin_memory",
    "mics_shard_size",
}
_OFFLOAD_IGNORED = {
    "buffer_count": "a DeepSpeed offload buffer setting",
    "buffer_size": "a DeepSpeed offload buffer setting",
    "max_in_cpu": "a DeepSpeed NVMe offload setting",
    "fast_init": "a DeepSpeed offload start-up setting",
    "pipeline": "DeepSpeed's NVMe read/write pipelining",
    "pipeline_read": "DeepSpeed's NVMe read/write pipelining",
    "pipeline_write": "DeepSpeed's NVMe read/write pipelining",
    "ratio": "FSDP2 offloads the whole optimizer step, not a fraction of it",
}
_FP16_IGNORED = {
    "hysteresis": "torch's GradScaler lowers the scale at the first overflow",
    "consecutive_hysteresis": "torch's GradScaler lowers the scale at the first overflow",
    "min_loss_scale": "torch's GradScaler has no lower bound on the scale",
    "fp16_master_weights_and_grads": "the sharded master weights stay float32",
    "auto_cast": "FSDP2 casts every floating-point input of the model to float16",
}
_BF16_IGNORED = {
    "immediate_grad_update": "FSDP2 accumulates gradients on the float32 shards",
    "check_grad_overflow": "bfloat16 trains without overflow checks",
    "accumulate_grads_via_hooks": "FSDP2 accumulates gradients on the float32 shards",
}
_AC_DEEPSPEED_KEYS = {
    "partition_activations": "it partitions checkpoints across model-parallel ranks, which "
    "DeepSpeed's model code does; FSDP2's checkpoints stay whole on each rank",
    "cpu_checkpointing": "checkpointed activations stay on the device",
    "contiguous_memory_optimization": "torch's checkpoint_wrapper manages its memory",
    "number_checkpoints": "torch's checkpoint_wrapper manages its memory",
    "synchronize_checkpoint_boundary": "no synchronisation is needed",
    "profile": "DeepSpeed's checkpoint profiling",
}
_OPTIMIZER_REFUSED = {
    "OneBitAdam": "1-bit compressed communication",
    "OneBitLamb": "1-bit compressed communication",
    "ZeroOneAdam": "0/1 compressed communication",
    "MuAdam": "muP optimizers",
    "MuAdamW": "muP optimizers",
    "MuSGD": "muP optimizers",
}
_OPTIMIZER_NAMES = {"AdaGrad": "Adagrad", "CPUAdam": "AdamW", "DeepSpeedCPUAdam": "AdamW"}


# ---------------------------------------------------------------------------- translation
@dataclass(frozen=True)
class DeepSpeedTranslation:
    """What a DeepSpeed config means in FSDP2 terms.

    Attributes:
        strategy_kwargs: :class:`FSDPStrategy` keywords (``model_wrapper``,
            ``activation_checkpointing``, ``train_micro_batch_size_per_gpu``, ``parallelism``).
        optim_wrapper: settings of the optimizer wrapper (``type``: ``'OptimWrapper'`` or
            ``'AmpOptimWrapper'``; ``clip_grad``, ``accumulative_counts``, ``dtype``,
            ``loss_scale`` when the config sets them).
        optimizer: the config's ``optimizer`` section as an optimizer config, or None.
        notes: keys mapped onto something close but not identical, each with how.
        ignored: keys accepted and not honoured, each with why.
    """

    strategy_kwargs: dict[str, Any] = field(default_factory=dict)
    optim_wrapper: dict[str, Any] = field(default_factory=dict)
    optimizer: dict[str, Any] | None = None
    notes: tuple[str, ...] = ()
    ignored: tuple[str, ...] = ()

    def log(self, log: logging.Logger) -> None:
        """Log the notes (info) and the keys not honoured (one warning)."""
        for note in self.notes:
            log.info("DeepSpeed config: %s", note)
        if self.ignored:
            log.warning(
                "DeepSpeed config keys not honoured on FSDP2 (ignored): %s", "; ".join(self.ignored)
            )


def load_deepspeed_config(config: str | os.PathLike[str] | Mapping[str, Any] | None) -> dict:
    """A DeepSpeed config as a dict: a JSON file's content, a copy of a dict, or ``{}``."""
    if config is None:
        return {}
    if isinstance(config, str | os.PathLike):
        try:
            with open(config, encoding="utf-8") as f:
                loaded = json.load(f)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"DeepSpeedStrategy config={str(config)!r}: no such DeepSpeed JSON file"
            ) from None
        except json.JSONDecodeError as exc:
            raise ValueError(
                f"DeepSpeedStrategy config={str(config)!r} is not valid JSON: {exc}"
            ) from None
        if not isinstance(loaded, dict):
            raise ValueError(
                f"DeepSpeedStrategy config={str(config)!r} holds a "
                f"{type(loaded).__name__}, not a JSON object of DeepSpeed keys"
            )
        return loaded
    if isinstance(config, Mapping):
        return copy.deepcopy(dict(config))
    raise TypeError(
        "DeepSpeedStrategy config must be the path of a DeepSpeed JSON file or a dict of "
        f"DeepSpeed keys, got {type(config).__name__}: {config!r}"
    )


def _unknown(keys: Any, known: Any, where: str) -> None:
    for key in keys:
        if key not in known:
            close = difflib.get_close_matches(str(key), sorted(known), n=3)
            hint = f" (did you mean {', '.join(map(repr, close))}?)" if close else ""
            raise ValueError(
                f"{where}{key!r} is not a DeepSpeed config key shardwise knows{hint}; the "
                f"known keys are {', '.join(sorted(known))}"
            )


def _section(config: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = config.get(key)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise TypeError(f"{key} must be a dict of DeepSpeed keys, got {value!r}")
    return dict(value)


def _enabled(section: Mapping[str, Any], key: str, ignored: list[str]) -> bool:
    """``section['enabled']`` (False when absent, as in DeepSpeed)."""
    enabled = section.get("enabled", False)
    if enabled == "auto":
        raise ValueError(
            f"{key}.enabled='auto' is a placeholder Hugging Face's Trainer fills in; give "
            "True or False"
        )
    if not isinstance(enabled, bool):
        raise TypeError(f"{key}.enabled must be True or False, got {enabled!r}")
    others = sorted(set(section) - {"enabled"})
    if others and not enabled:
        ignored.append(f"{key}: {others} are off, as in DeepSpeed: {key}.enabled is not True")
    return enabled


def _positive_int(value: Any, key: str) -> int:
    if value == "auto":
        raise ValueError(
            f"{key}='auto' is a placeholder Hugging Face's Trainer fills in; give a number"
        )
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{key} must be a positive int, got {value!r}")
    return value


def _dtype_name(value: Any, key: str) -> str:
    names = {
        "fp32": "float32",
        "float32": "float32",
        "fp16": "float16",
        "float16": "float16",
        "half": "float16",
        "bf16": "bfloat16",
        "bfloat16": "bfloat16",
    }
    name = names.get(str(value).lower().removeprefix("torch."))
    if name is None:
        raise ValueError(f"{key}={value!r} is not one of fp32, fp16, bf16")
    return name


def _offload(zero: Mapping[str, Any], key: str, ignored: list[str]) -> tuple[bool, bool | None]:
    """(offload to the CPU?, pin_memory) of ``offload_optimizer``/``offload_param``."""
    section = zero.get(key)
    if section is None:
        return False, None
    if not isinstance(section, Mapping):
        raise TypeError(f"zero_optimization.{key} must be a dict such as dict(device='cpu')")
    known = {"device", "pin_memory", "nvme_path", *_OFFLOAD_IGNORED}
    _unknown(section, known, f"zero_optimization.{key}: ")
    device = str(section.get("device", "none")).lower()
    if device == "nvme" or section.get("nvme_path") is not None:
        raise ValueError(
            f"zero_optimization.{key}.device='nvme': NVMe offload (ZeRO-Infinity) has no FSDP2 "
            "counterpart; offload to device='cpu', or drop the offload"
        )
    if device not in ("cpu", "none"):
        raise ValueError(
            f"zero_optimization.{key}.device={section.get('device')!r} is not one of 'cpu', "
            "'none' ('nvme' has no FSDP2 counterpart)"
        )
    for name in sorted(set(section) & set(_OFFLOAD_IGNORED)):
        ignored.append(f"zero_optimization.{key}.{name}: {_OFFLOAD_IGNORED[name]}")
    pin = section.get("pin_memory")
    return device == "cpu", None if pin is None else bool(pin)


def _zero(
    zero: Mapping[str, Any], notes: list[str], ignored: list[str]
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``model_wrapper`` keys and ``parallelism`` of ``zero_optimization``."""
    _unknown(zero, _ZERO_TRANSLATED | set(_ZERO_IGNORED), "zero_optimization.")
    stage = zero.get("stage", 0)
    if stage is True or stage is False:
        stage = int(stage)
    if stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_optimization.stage must be 0, 1, 2 or 3, got {stage!r}")
    sharding = {0: "NO_SHARD", 1: "SHARD_GRAD_OP", 2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}[stage]
    if stage == 1:
        notes.append(
            "zero_optimization.stage=1 runs as stage 2 (sharding_strategy='SHARD_GRAD_OP', "
            "parameters kept gathered from forward to backward): FSDP2 cannot shard the "
            "optimizer state alone, so gradients are sharded too (less memory, the same "
            "communication volume, the same numbers). DDPStrategy with a "
            "ZeroRedundancyOptimizer shards only the optimizer state"
        )
    wrapper: dict[str, Any] = {"sharding_strategy": sharding}
    for name in sorted(set(zero) & set(_ZERO_IGNORED)):
        ignored.append(f"zero_optimization.{name}: {_ZERO_IGNORED[name]}")
    optimizer_cpu, optimizer_pin = _offload(zero, "offload_optimizer", ignored)
    param_cpu, param_pin = _offload(zero, "offload_param", ignored)
    if zero.get("cpu_offload"):  # DeepSpeed's deprecated spelling of offload_optimizer
        optimizer_cpu = True
    if zero.get("cpu_offload_params"):
        param_cpu = True
    if zero.get("cpu_offload_use_pin_memory") is not None:
        optimizer_pin = bool(zero["cpu_offload_use_pin_memory"])
    if optimizer_cpu or param_cpu:
        pins = [p for p in (param_pin, optimizer_pin) if p is not None]
        wrapper["cpu_offload"] = dict(offload_params=True, pin_memory=all(pins) if pins else True)
        if optimizer_cpu and not param_cpu:
            notes.append(
                "zero_optimization.offload_optimizer runs as FSDP2's CPU offload "
                "(cpu_offload=True): the optimizer steps on the CPU as in ZeRO-Offload, and "
                "the parameter shards live there too, copied to the device for each forward "
                "and backward (FSDP2 offloads parameters, gradients and optimizer state "
                "together)"
            )
    parallelism = None
    if zero.get("mics_shard_size") not in (None, -1):
        size = _positive_int(zero["mics_shard_size"], "zero_optimization.mics_shard_size")
        if stage == 0:
            raise ValueError(
                "zero_optimization.mics_shard_size shards within groups, but stage=0 does not "
                "shard; set stage=3 (or 2)"
            )
        parallelism = dict(dp_shard=size, dp_replicate=-1)
    return wrapper, parallelism


def _precision(
    config: Mapping[str, Any], notes: list[str], ignored: list[str]
) -> tuple[dict[str, Any] | None, dict[str, Any]]:
    """``model_wrapper.mixed_precision`` and the optimizer wrapper's precision settings."""
    fp16, bf16, amp = (_section(config, k) for k in ("fp16", "bf16", "amp"))
    bf16 = bf16 or _section(config, "bfloat16")
    fp16_on, bf16_on, amp_on = (
        _enabled(fp16, "fp16", ignored),
        _enabled(bf16, "bf16", ignored),
        _enabled(amp, "amp", ignored),
    )
    if sum((fp16_on, bf16_on, amp_on)) > 1:
        on = [k for k, v in (("fp16", fp16_on), ("bf16", bf16_on), ("amp", amp_on)) if v]
        raise ValueError(f"{' and '.join(on)} are both enabled; enable one precision")
    comm = config.get("communication_data_type")
    reduce_dtype = _dtype_name(comm, "communication_data_type") if comm is not None else "float32"
    grad_accum = _section(config, "data_types").get("grad_accum_dtype")
    if grad_accum is not None and _dtype_name(grad_accum, "data_types.grad_accum_dtype") != (
        "float32"
    ):
        ignored.append(
            "data_types.grad_accum_dtype: FSDP2 accumulates gradients on the float32 shards"
        )
    if comm is not None and not (fp16_on or bf16_on):
        ignored.append(
            "communication_data_type: without fp16/bf16 the parameters and gradients are "
            "float32 and reduced as such"
        )
    if bf16_on:
        _unknown(bf16, {"enabled", *_BF16_IGNORED}, "bf16.")
        ignored += [f"bf16.{k}: {_BF16_IGNORED[k]}" for k in sorted(set(bf16) & set(_BF16_IGNORED))]
        return dict(param_dtype="bfloat16", reduce_dtype=reduce_dtype), {"type": "OptimWrapper"}
    if fp16_on:
        known = {"enabled", "loss_scale", "initial_scale_power", "loss_scale_window"}
        _unknown(fp16, known | set(_FP16_IGNORED), "fp16.")
        ignored += [f"fp16.{k}: {_FP16_IGNORED[k]}" for k in sorted(set(fp16) & set(_FP16_IGNORED))]
        static = fp16.get("loss_scale", 0)
        if isinstance(static, bool) or not isinstance(static, int | float) or static < 0:
            raise ValueError(
                f"fp16.loss_scale must be 0 (dynamic) or a positive number, got {static!r}"
            )
        if static:
            loss_scale: Any = float(static)
        else:
            power = fp16.get("initial_scale_power", 16)
            window = _positive_int(fp16.get("loss_scale_window", 1000), "fp16.loss_scale_window")
            loss_scale = dict(init_scale=2.0**power, growth_interval=window)
        wrapper = {"type": "AmpOptimWrapper", "dtype": "float16", "loss_scale": loss_scale}
        return dict(param_dtype="float16", reduce_dtype=reduce_dtype), wrapper
    if amp_on:
        level = amp.get("opt_level", "O1")
        others = sorted(set(amp) - {"enabled", "opt_level"})
        if level != "O1":
            notes.append(
                f"amp.opt_level={level!r} runs as torch's autocast (Apex's O1): the weights "
                "stay float32"
            )
        ignored += [f"amp.{k}: an Apex option; torch's autocast and GradScaler run" for k in others]
        return None, {"type": "AmpOptimWrapper", "dtype": "float16"}
    return None, {"type": "OptimWrapper"}


def _activation_checkpointing(
    section: Mapping[str, Any], ignored: list[str]
) -> dict[str, Any] | None:
    for key in sorted(set(section) & set(_AC_DEEPSPEED_KEYS)):
        ignored.append(f"activation_checkpointing.{key}: {_AC_DEEPSPEED_KEYS[key]}")
    own = {k: v for k, v in section.items() if k not in _AC_DEEPSPEED_KEYS}
    if "check_fn" not in own:
        if own:
            raise ValueError(
                f"activation_checkpointing has {sorted(own)} but no check_fn; add "
                "check_fn={'Block'} naming the modules to checkpoint"
            )
        if section:
            ignored.append(
                "activation_checkpointing: DeepSpeed checkpoints only where the model calls "
                "deepspeed.checkpointing.checkpoint, so nothing is checkpointed; add "
                "check_fn={'Block'} to have FSDP2 checkpoint those modules"
            )
        return None
    return own


def _optimizer(section: Mapping[str, Any], notes: list[str]) -> dict[str, Any] | None:
    if not section:
        return None
    _unknown(section, {"type", "params"}, "optimizer.")
    name = section.get("type")
    if not isinstance(name, str):
        raise ValueError(f"optimizer.type must name an optimizer, got {name!r}")
    if name in _OPTIMIZER_REFUSED:
        raise ValueError(
            f"optimizer.type={name!r}: DeepSpeed's {_OPTIMIZER_REFUSED[name]} has no "
            "counterpart here; use a torch optimizer such as 'AdamW'"
        )
    params = dict(section.get("params") or {})
    lowered = name.lower()
    if lowered in ("adam", "adamw", "cpuadam", "deepspeedcpuadam"):
        decoupled = params.pop("adam_w_mode", True) or lowered != "adam"
        for key in ("torch_adam", "adamw_mode", "fp32_optimizer_states"):
            params.pop(key, None)
        if params.pop("bias_correction", True) is False:
            raise ValueError(
                f"optimizer.params.bias_correction=False: torch's {name} always corrects the "
                "bias; drop the key"
            )
        target = "AdamW" if decoupled else "Adam"
        if lowered == "adam" and decoupled:
            notes.append(
                "optimizer.type='Adam' runs as torch's AdamW: DeepSpeed's Adam decouples the "
                "weight decay unless params.adam_w_mode=False"
            )
    else:
        target = _OPTIMIZER_NAMES.get(name, name)
    return {"type": target, **params}


def deepspeed_to_fsdp(
    config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
    *,
    world_size: int | None = None,
    inputs_to_half: Any = None,
    exclude_frozen_parameters: bool | None = None,
    **keys: Any,
) -> DeepSpeedTranslation:
    """Translate a DeepSpeed config into FSDP2 settings (see the module docstring's table).

    Args:
        config: DeepSpeed's JSON file or a dict of its keys; ``keys`` (DeepSpeed keys, such as
            mmengine's ``DeepSpeedStrategy`` keywords ``zero_optimization``, ``bf16``, ...)
            replace the config's entries of the same name, as mmengine's keywords do.
        world_size: the number of ranks, to check ``train_batch_size`` (or derive the micro
            batch from it); None skips that.
        inputs_to_half, exclude_frozen_parameters: mmengine's own keywords.

    Raises:
        ValueError, TypeError: a key that cannot be honoured or a bad value, naming the key,
            why, and the fix.

    Example::

        >>> t = deepspeed_to_fsdp(zero_optimization=dict(stage=2), gradient_clipping=1.0)
        >>> t.strategy_kwargs['model_wrapper'], t.optim_wrapper['clip_grad']
        ({'sharding_strategy': 'SHARD_GRAD_OP'}, {'max_norm': 1.0})
    """
    merged = load_deepspeed_config(config)
    merged.update({k: v for k, v in keys.items() if v is not None})
    _unknown(merged, _TRANSLATED | set(_IGNORED) | set(_REFUSED), "")
    for key in sorted(set(merged) & set(_REFUSED)):
        raise ValueError(f"{key}: {_REFUSED[key]}")
    notes: list[str] = []
    ignored = [f"{k}: {_IGNORED[k]}" for k in sorted(set(merged) & set(_IGNORED))]

    model_wrapper, parallelism = _zero(_section(merged, "zero_optimization"), notes, ignored)
    mixed_precision, wrapper = _precision(merged, notes, ignored)
    if mixed_precision is not None:
        model_wrapper["mixed_precision"] = mixed_precision
    strategy: dict[str, Any] = {"model_wrapper": model_wrapper}
    if parallelism is not None:
        strategy["parallelism"] = parallelism

    clipping = merged.get("gradient_clipping", 0.0)
    if isinstance(clipping, bool) or not isinstance(clipping, int | float) or clipping < 0:
        raise ValueError(f"gradient_clipping must be a number >= 0 (0: off), got {clipping!r}")
    if clipping:
        wrapper["clip_grad"] = dict(max_norm=float(clipping))
    steps = merged.get("gradient_accumulation_steps")
    steps = 1 if steps is None else _positive_int(steps, "gradient_accumulation_steps")
    if steps > 1:
        wrapper["accumulative_counts"] = steps
    micro = merged.get("train_micro_batch_size_per_gpu")
    if micro is not None:
        micro = _positive_int(micro, "train_micro_batch_size_per_gpu")
    total = merged.get("train_batch_size")
    if total is not None:
        total = _positive_int(total, "train_batch_size")
        if world_size is not None and micro is not None and total != micro * steps * world_size:
            raise ValueError(
                f"train_batch_size={total} is not train_micro_batch_size_per_gpu={micro} x "
                f"gradient_accumulation_steps={steps} x {world_size} rank(s) = "
                f"{micro * steps * world_size}; fix one of them or drop train_batch_size"
            )
        if world_size is not None and micro is None:
            if total % (steps * world_size):
                raise ValueError(
                    f"train_batch_size={total} is not divisible by gradient_accumulation_steps"
                    f"={steps} x {world_size} rank(s); give train_micro_batch_size_per_gpu"
                )
            micro = total // (steps * world_size)
    if micro is not None:
        strategy["train_micro_batch_size_per_gpu"] = micro

    ac = _activation_checkpointing(_section(merged, "activation_checkpointing"), ignored)
    if ac is not None:
        strategy["activation_checkpointing"] = ac
    optimizer = _optimizer(_section(merged, "optimizer"), notes)

    if inputs_to_half is not None:
        ignored.append(
            "inputs_to_half: FSDP2 casts every floating-point input of the model's forward to "
            "the fp16/bf16 parameter dtype (mixed_precision cast_forward_inputs), the listed "
            "ones and the others"
        )
    if exclude_frozen_parameters:
        ignored.append(
            "exclude_frozen_parameters: checkpoints hold the frozen parameters too (a resume "
            "and load_checkpoint need them)"
        )
    return DeepSpeedTranslation(strategy, wrapper, optimizer, tuple(notes), tuple(ignored))


_WRAPPER_TYPES = (None, "DeepSpeedOptimWrapper", "OptimWrapper")


def translate_optim_wrapper(optim_wrapper: Any, translation: DeepSpeedTranslation) -> Any:
    """The ``optim_wrapper`` argument with the DeepSpeed config's settings applied: its type
    becomes ``'OptimWrapper'`` or ``'AmpOptimWrapper'`` (per the precision), with the
    config's clipping, accumulation and optimizer section. A setting given both here and in
    the DeepSpeed config must agree."""
    settings = translation.optim_wrapper
    if optim_wrapper is None:
        return None
    if not isinstance(optim_wrapper, Mapping):
        extra = sorted(k for k in settings if k != "type")
        if settings.get("type") != "OptimWrapper" or extra or translation.optimizer:
            raise ValueError(
                "DeepSpeedStrategy applies the DeepSpeed config's "
                f"{extra or ['precision']} to the optimizer wrapper it builds; give "
                "optim_wrapper as a config, e.g. dict(type='DeepSpeedOptimWrapper', "
                "optimizer=dict(type='AdamW', lr=1e-4)), not a built "
                f"{type(optim_wrapper).__name__}"
            )
        return optim_wrapper
    parts = optim_wrapper_parts(optim_wrapper)
    if SINGLE not in parts:
        raise ValueError(
            f"DeepSpeedStrategy trains one optimizer, but optim_wrapper has several "
            f"({sorted(parts)}); use FSDPStrategy for several optimizers"
        )
    cfg = dict(parts[SINGLE])
    given = cfg.get("type")
    if given not in _WRAPPER_TYPES and getattr(given, "__name__", None) not in _WRAPPER_TYPES:
        raise ValueError(
            f"optim_wrapper.type={given!r}: DeepSpeedStrategy builds the wrapper the DeepSpeed "
            "config asks for (fp16/amp: AmpOptimWrapper, else OptimWrapper); give "
            "type='DeepSpeedOptimWrapper'"
        )
    cfg["type"] = settings["type"]
    for key, value in settings.items():
        if key == "type":
            continue
        if key in cfg and cfg[key] != value:
            source = {
                "clip_grad": "gradient_clipping",
                "accumulative_counts": "gradient_accumulation_steps",
            }.get(key, "fp16")
            raise ValueError(
                f"optim_wrapper.{key}={cfg[key]!r} disagrees with the DeepSpeed config's "
                f"{source} ({value!r}); set it in one place"
            )
        cfg[key] = value
    if translation.optimizer is not None:
        if cfg.get("optimizer") is not None:
            raise ValueError(
                "both optim_wrapper.optimizer and the DeepSpeed config's optimizer section "
                "name an optimizer; keep one"
            )
        cfg["optimizer"] = dict(translation.optimizer)
    elif cfg.get("optimizer") is None and cfg.get("constructor") is None:
        raise ValueError(
            "optim_wrapper has no optimizer: give optim_wrapper=dict(type="
            "'DeepSpeedOptimWrapper', optimizer=dict(type='AdamW', lr=...)), or an optimizer "
            "section in the DeepSpeed config"
        )
    return cfg


def _world_size() -> int:
    import torch.distributed as torch_dist

    if torch_dist.is_available() and torch_dist.is_initialized():
        return torch_dist.get_world_size()
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def _split(kwargs: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(DeepSpeed keywords, FSDPStrategy keywords) of a DeepSpeedStrategy's keywords."""
    own = {"config", "inputs_to_half", "exclude_frozen_parameters", *MMENGINE_CONFIG_KEYWORDS}
    return (
        {k: v for k, v in kwargs.items() if k in own},
        {k: v for k, v in kwargs.items() if k not in own},
    )


def _fsdp_kwargs(translation: DeepSpeedTranslation, given: Mapping[str, Any]) -> dict[str, Any]:
    """``FSDPStrategy`` keywords: the translation's, with the caller's own FSDPStrategy
    keywords (``model_wrapper``'s ``auto_wrap_policy``, ``state_dict_cfg``, ...) added; a
    keyword both set must agree."""
    kwargs = {k: v for k, v in given.items() if k != "model_wrapper"}
    for key, value in translation.strategy_kwargs.items():
        if key == "model_wrapper":
            continue
        if key in kwargs and kwargs[key] != value:
            raise ValueError(
                f"{key}={kwargs[key]!r} disagrees with the DeepSpeed config ({value!r}); set "
                "it in one place"
            )
        kwargs[key] = value
    wrapper = dict(given.get("model_wrapper") or {})
    for key, value in translation.strategy_kwargs["model_wrapper"].items():
        if key in wrapper and wrapper[key] != value:
            raise ValueError(
                f"model_wrapper.{key}={wrapper[key]!r} disagrees with the DeepSpeed config "
                f"({value!r}); set it in the DeepSpeed config only"
            )
        wrapper[key] = value
    kwargs["model_wrapper"] = wrapper
    return kwargs


@STRATEGIES.register_module()
class DeepSpeedStrategy(FSDPStrategy):
    """mmengine's ``DeepSpeedStrategy`` configuration, trained by FSDP2: an
    :class:`FSDPStrategy` built from :func:`deepspeed_to_fsdp` (see the module docstring).

    Args:
        config: a DeepSpeed JSON file or a dict of DeepSpeed keys; the keywords below
            replace its entries of the same name (as mmengine's do).
        zero_optimization, gradient_clipping, fp16, bf16, amp, activation_checkpointing, aio,
        train_micro_batch_size_per_gpu, gradient_accumulation_steps, steps_per_print,
        inputs_to_half, exclude_frozen_parameters: mmengine 0.10.7's keywords.
        **kwargs: :class:`FSDPStrategy` keywords (``work_dir``, ``state_dict_cfg``,
            ``model_wrapper=dict(auto_wrap_policy=...)``, ``skip_init_weights``, ...).

    The optimizer wrapper (``optim_wrapper=dict(type='DeepSpeedOptimWrapper',
    optimizer=...)``) gets the config's precision, clipping and accumulation.

    Example::

        >>> strategy = DeepSpeedStrategy(config='ds_config.json', work_dir='work_dirs/x')
        >>> model, optim_wrapper = strategy.prepare(
        ...     model, optim_wrapper=dict(type='DeepSpeedOptimWrapper',
        ...                               optimizer=dict(type='AdamW', lr=1e-4)))
    """

    def __init__(
        self,
        *,
        config: str | os.PathLike[str] | Mapping[str, Any] | None = None,
        zero_optimization: Mapping[str, Any] | None = None,
        gradient_clipping: float | None = None,
        fp16: Mapping[str, Any] | None = None,
        inputs_to_half: list[int | str] | None = None,
        bf16: Mapping[str, Any] | None = None,
        amp: Mapping[str, Any] | None = None,
        activation_checkpointing: Mapping[str, Any] | None = None,
        aio: Mapping[str, Any] | None = None,
        train_micro_batch_size_per_gpu: int | None = None,
        gradient_accumulation_steps: int | None = None,
        steps_per_print: int | None = None,
        exclude_frozen_parameters: bool | None = None,
        **kwargs: Any,
    ) -> None:
        deepspeed = dict(
            zero_optimization=zero_optimization,
            gradient_clipping=gradient_clipping,
            fp16=fp16,
            bf16=bf16,
            amp=amp,
            activation_checkpointing=activation_checkpointing,
            aio=aio,
            train_micro_batch_size_per_gpu=train_micro_batch_size_per_gpu,
            gradient_accumulation_steps=gradient_accumulation_steps,
            steps_per_print=steps_per_print,
        )
        self.deepspeed = deepspeed_to_fsdp(
            config,
            world_size=_world_size(),
            inputs_to_half=inputs_to_half,
            exclude_frozen_parameters=exclude_frozen_parameters,
            **deepspeed,
        )
        super().__init__(**_fsdp_kwargs(self.deepspeed, kwargs))
        self.deepspeed.log(self.logger)

    @classmethod
    def _check_kwargs(cls, kwargs: Mapping[str, Any], world_size: int, local_size: int) -> None:
        deepspeed, fsdp = _split(kwargs)
        translation = deepspeed_to_fsdp(world_size=world_size, **deepspeed)
        translation.log(logger)
        super()._check_kwargs(_fsdp_kwargs(translation, fsdp), world_size, local_size)

    @classmethod
    def translate_optim_wrapper_config(
        cls, strategy_cfg: Mapping[str, Any], optim_wrapper: Any, world_size: int = 1
    ) -> Any:
        """The ``optim_wrapper`` config this strategy builds from ``optim_wrapper`` (for the
        config check, before any worker starts)."""
        deepspeed, _ = _split({k: v for k, v in strategy_cfg.items() if k != "type"})
        return translate_optim_wrapper(
            optim_wrapper, deepspeed_to_fsdp(world_size=world_size, **deepspeed)
        )

    def build_optim_wrapper(self, optim_wrapper: Any, model: Any = None) -> Any:
        """As :meth:`FSDPStrategy.build_optim_wrapper`, with the DeepSpeed config's precision,
        clipping, accumulation and optimizer applied (:func:`translate_optim_wrapper`)."""
        optim_wrapper = translate_optim_wrapper(optim_wrapper, self.deepspeed)
        return super().build_optim_wrapper(optim_wrapper, model)
