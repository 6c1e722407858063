"""The registry against the oracle, mmengine 0.10's: the same trees answer the same lookups,
bad configs fail with the same exception types, and PARAM_SCHEDULERS converts epoch-based
schedulers to iteration-based ones with the same learning rates."""

import pytest
import torch

from shardwise import registry as sw

mm_registry = pytest.importorskip("mmengine.registry", reason="the oracle is mmengine's registry")

KEYS = [
    "GoldenRetriever",
    "BloodHound",
    "Dachshund",
    "Beagle",
    "hound.BloodHound",
    "hound.little_hound.Dachshund",
    "little_hound.Dachshund",
    "hound.mid_hound.Beagle",
    "samoyed.PedigreeSamoyed",
    "samoyed.Beagle",
    "samoyedddd.PedigreeSamoyed",
    "mid_hound.PedigreeSamoyed",
    "GoldenRetrieverererer",
    "torch.optim.AdamW",
    "torch.nn",
    "torch.nn.NoSuchLayer",
]


def _tree(module):
    """One registry tree of ``module``'s Registry class, with the same classes registered."""
    root = module.Registry("dogs")
    hounds = module.Registry("hounds", parent=root, scope="hound")
    regs = {
        "root": root,
        "hounds": hounds,
        "little": module.Registry("little", parent=hounds, scope="little_hound"),
        "mid": module.Registry("mid", parent=hounds, scope="mid_hound"),
        "samoyeds": module.Registry("samoyeds", parent=root, scope="samoyed"),
    }
    for where, name in [
        ("root", "GoldenRetriever"),
        ("hounds", "BloodHound"),
        ("little", "Dachshund"),
        ("mid", "Beagle"),
        ("samoyeds", "PedigreeSamoyed"),
    ]:
        regs[where].register_module(module=type(name, (), {}))
    return regs


def _answer(obj):
    return None if obj is None else getattr(obj, "__qualname__", getattr(obj, "__name__", obj))


@pytest.mark.parametrize("where", ["root", "hounds", "little", "mid", "samoyeds"])
def test_lookups_in_a_scope_tree_match_mmengine(where):
    ours, theirs = _tree(sw)[where], _tree(mm_registry)[where]
    for key in KEYS:
        assert _answer(ours.get(key)) == _answer(theirs.get(key)), key
        assert (key in ours) == (key in theirs), key
    assert ours.scope == theirs.scope
    assert len(ours) == len(theirs)
    assert ours.split_scope_key("a.b.c") == theirs.split_scope_key("a.b.c")


def test_scope_switches_pick_the_registry_mmengine_picks():
    ours, theirs = _tree(sw), _tree(mm_registry)
    try:
        sw.DefaultScope.get_instance("oracle-task", scope_name="samoyed")
        mm_registry.DefaultScope.get_instance("oracle-task", scope_name="samoyed")
        for scope in (None, "hound", "little_hound", "samoyed"):
            for name in ours:
                with ours[name].switch_scope_and_registry(scope) as mine:
                    with theirs[name].switch_scope_and_registry(scope) as oracle:
                        assert mine.name == oracle.name, (name, scope)
    finally:
        sw.DefaultScope._instance_dict.clear()
        mm_registry.DefaultScope._instance_dict.clear()


BAD_CFGS = [
    ("ResNet", None),
    (dict(depth=50), None),
    (dict(depth=50), dict(stages=4)),
    (dict(type=1000), None),
    (dict(type="VGG"), None),
    (dict(type="ResNet", non_existing_arg=50), None),
    (dict(type="ResNet", depth=50), 1),
]


@pytest.mark.parametrize(("cfg", "default_args"), BAD_CFGS)
def test_bad_configs_fail_with_mmengine_exception_types(cfg, default_args):
    def error(module):
        backbones = module.Registry("backbone")

        @backbones.register_module()
        class ResNet:
            def __init__(self, depth, stages=4):
                self.depth, self.stages = depth, stages

        with pytest.raises(Exception) as info:
            module.build_from_cfg(cfg, backbones, default_args)
        return info.type

    assert error(sw) is error(mm_registry)


def _lrs(scheduler, wrapper, epochs, epoch_length):
    """The learning rate of each param group at each iteration, flat."""
    lrs = []
    for _ in range(epochs * epoch_length):
        lrs.extend(group["lr"] for group in wrapper.optimizer.param_groups)
        wrapper.step()
        scheduler.step()
    return lrs


@pytest.mark.parametrize(
    "cfg",
    [
        dict(type="LinearLR", start_factor=0.1, begin=0, end=2),
        dict(type="CosineAnnealingLR", T_max=3, eta_min=0.01, begin=1, end=4),
        dict(type="MultiStepLR", milestones=[1, 3], gamma=0.5),
        dict(type="StepLR", step_size=2, gamma=0.3),
    ],
    ids=lambda cfg: cfg["type"],
)
def test_param_schedulers_convert_to_iter_based_like_mmengine(cfg):
    import mmengine.optim

    from shardwise.optim import OptimWrapper

    def run(registry, wrapper_cls):
        params = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))]
        optimizer = torch.optim.SGD([{"params": params[:1]}, {"params": params[1:], "lr": 0.5}])
        optimizer.param_groups[0]["lr"] = 0.05
        wrapper = wrapper_cls(optimizer=optimizer)
        scheduler = registry.build(
            dict(cfg, by_epoch=True, convert_to_iter_based=True),
            default_args=dict(optimizer=wrapper, epoch_length=10),
        )
        assert (scheduler.by_epoch, scheduler.begin) == (False, 10 * cfg.get("begin", 0))
        return _lrs(scheduler, wrapper, epochs=5, epoch_length=10)

    ours = run(sw.PARAM_SCHEDULERS, OptimWrapper)
    theirs = run(mm_registry.PARAM_SCHEDULERS, mmengine.optim.OptimWrapper)
    assert ours == pytest.approx(theirs, rel=1e-6)


def test_param_schedulers_take_epoch_length_from_the_config_as_mmengine_does():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    cfg = dict(
        type="LinearParamScheduler",
        param_name="lr",
        optimizer=optimizer,
        begin=0,
        end=100,
        convert_to_iter_based=True,
        epoch_length=10,
    )
    ours = sw.PARAM_SCHEDULERS.build(cfg)
    assert (ours.begin, ours.end) == (0, 1000)
    cfg.pop("convert_to_iter_based")
    assert sw.PARAM_SCHEDULERS.build(cfg).end == 100  # epoch_length is dropped unused
