"""Registry trees: parents, scopes, prefixed names, inherited build functions, DefaultScope."""

import logging

import pytest

from shardwise.registry import (
    MODELS,
    DefaultScope,
    Registry,
    build_from_cfg,
    build_model_from_cfg,
    init_default_scope,
)


@pytest.fixture(autouse=True)
def no_default_scope(monkeypatch):
    """Each test starts without a default scope and leaves none behind."""
    monkeypatch.setattr(DefaultScope, "_instance_dict", type(DefaultScope._instance_dict)())


@pytest.fixture()
def dogs():
    """DOGS ─┬─ HOUNDS (hound) ─┬─ LITTLE (little_hound)
    │                  └─ MID (mid_hound)
    └─ SAMOYEDS (samoyed)"""
    root = Registry("dogs")
    hounds = Registry("hounds", parent=root, scope="hound")
    little = Registry("little hounds", parent=hounds, scope="little_hound")
    mid = Registry("mid hounds", parent=hounds, scope="mid_hound")
    samoyeds = Registry("samoyeds", parent=root, scope="samoyed")

    classes = {}
    for registry, name in [
        (root, "GoldenRetriever"),
        (hounds, "BloodHound"),
        (little, "Dachshund"),
        (mid, "Beagle"),
        (samoyeds, "PedigreeSamoyed"),
    ]:
        classes[name] = registry.register_module(module=type(name, (), {}))
    return dict(root=root, hounds=hounds, little=little, mid=mid, samoyeds=samoyeds), classes


def test_scope_defaults_to_the_top_level_package_of_the_creating_module():
    assert Registry("cat").scope == __name__.split(".")[0]
    assert Registry("cat", scope="cat").scope == "cat"
    assert MODELS.scope == "shardwise"


def test_a_child_is_reachable_from_its_parent_and_the_root(dogs):
    reg, _ = dogs
    assert reg["hounds"].parent is reg["root"]
    assert reg["root"].children["hound"] is reg["hounds"]
    assert reg["little"].root is reg["root"]
    assert reg["root"]._search_child("little_hound") is reg["little"]
    assert reg["little"]._search_child("hound") is None


def test_an_unprefixed_name_is_looked_up_here_then_in_the_ancestors(dogs):
    reg, cls = dogs
    assert reg["little"].get("Dachshund") is cls["Dachshund"]
    assert reg["little"].get("BloodHound") is cls["BloodHound"]
    assert reg["little"].get("GoldenRetriever") is cls["GoldenRetriever"]
    assert reg["root"].get("Dachshund") is None  # descendants need their scope prefix
    assert len(reg["hounds"]) == 1


def test_a_scope_prefix_finds_children_siblings_and_cousins(dogs):
    reg, cls = dogs
    assert reg["root"].get("hound.little_hound.Dachshund") is cls["Dachshund"]
    assert reg["hounds"].get("hound.BloodHound") is cls["BloodHound"]
    assert reg["little"].get("hound.mid_hound.Beagle") is cls["Beagle"]
    assert reg["little"].get("samoyed.PedigreeSamoyed") is cls["PedigreeSamoyed"]
    assert reg["root"].get("samoyed.Beagle") is None
    assert reg["root"].get("no_such_scope.Beagle") is None
    assert "hound.BloodHound" in reg["root"]


def test_a_child_inherits_its_parents_build_function_unless_given_one():
    backbones = Registry("backbone", build_func=build_model_from_cfg)
    assert Registry("model", parent=backbones, scope="new").build_func is build_model_from_cfg

    def build_twice(cfg, registry, default_args=None):
        return [build_from_cfg(cfg, registry, default_args)] * 2

    custom = Registry("model", parent=backbones, scope="custom", build_func=build_twice)
    custom.register_module(name="Thing", module=object)
    assert custom.build_func is build_twice
    first, second = custom.build(dict(type="Thing"))
    assert first is second


def test_two_children_with_one_scope_are_refused():
    root = Registry("dogs")
    Registry("hounds", parent=root, scope="hound")
    with pytest.raises(ValueError, match="scope 'hound' exists in the dogs registry"):
        Registry("other hounds", parent=root, scope="hound")


def test_bad_parent_or_scope_is_refused():
    with pytest.raises(TypeError, match="parent must be a Registry"):
        Registry("little_cat", parent="cat")
    with pytest.raises(TypeError, match="scope must be a str"):
        Registry("cat", scope=1)


def test_the_default_scope_picks_the_registry_a_build_resolves_in(dogs):
    reg, cls = dogs
    DefaultScope.get_instance("task", scope_name="mid_hound")
    assert isinstance(reg["little"].build(dict(type="Beagle")), cls["Beagle"])


def test_an_unknown_default_scope_builds_in_the_registry_itself(dogs, caplog):
    reg, cls = dogs
    DefaultScope.get_instance("task", scope_name="scope-not-found")
    with caplog.at_level(logging.WARNING, logger="shardwise.registry"):
        assert isinstance(reg["mid"].build(dict(type="Beagle")), cls["Beagle"])
    assert "no registry of scope 'scope-not-found'" in caplog.text


def test_a_scope_key_switches_scope_for_the_build_and_the_builds_inside_it(dogs):
    reg, cls = dogs

    @reg["samoyeds"].register_module()
    class MySamoyed:
        def __init__(self, friend):
            self.friend = reg["root"].build(friend)

    dog = reg["root"].build(
        dict(_scope_="samoyed", type="MySamoyed", friend=dict(type="PedigreeSamoyed"))
    )
    assert isinstance(dog.friend, cls["PedigreeSamoyed"])
    assert DefaultScope.get_current_instance() is None


def test_switch_scope_and_registry_nests_and_restores(dogs):
    reg, _ = dogs
    DefaultScope.get_instance("task", scope_name="samoyed")
    with reg["little"].switch_scope_and_registry("hound") as hounds:
        assert hounds is reg["hounds"]
        with reg["little"].switch_scope_and_registry("mid_hound") as mid:
            assert mid is reg["mid"]
            assert DefaultScope.get_current_instance().scope_name == "mid_hound"
        assert DefaultScope.get_current_instance().scope_name == "hound"
    assert DefaultScope.get_current_instance().scope_name == "samoyed"
    with reg["little"].switch_scope_and_registry(None) as current:
        assert current is reg["samoyeds"]


def test_without_a_default_scope_a_registry_builds_in_itself(dogs):
    reg, _ = dogs
    with reg["little"].switch_scope_and_registry(None) as current:
        assert current is reg["little"]


def test_default_scope_instances_are_kept_by_name():
    first = DefaultScope.get_instance("a", scope_name="x")
    assert DefaultScope.get_instance("a") is first
    assert DefaultScope.check_instance_created("a")
    DefaultScope.get_instance("b", scope_name="y")
    assert DefaultScope.get_current_instance().instance_name == "b"
    with pytest.raises(TypeError, match="scope_name should be a string"):
        DefaultScope.get_instance("c", scope_name=1)


def test_init_default_scope_makes_the_scope_current():
    init_default_scope("shardwise")
    assert DefaultScope.get_current_instance().scope_name == "shardwise"
    DefaultScope.get_instance("other", scope_name="mine")
    init_default_scope("shardwise")
    assert DefaultScope.get_current_instance().scope_name == "shardwise"
