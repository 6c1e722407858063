"""shardwise.tree: the one walk over nested state, with paths as tuples of strings; it walks
plain containers itself and must give what torch's pytree gives, container for container."""

from __future__ import annotations

from collections import OrderedDict, defaultdict, deque, namedtuple

import pytest
import torch
from torch.utils import _pytree as pytree

from shardwise.tree import map_with_path

Point = namedtuple("Point", "x y")

TREES = {
    "a checkpoint skeleton": {
        "state_dict": {"fc.weight": torch.ones(2), "fc.bias": None},
        "optimizer": {"state": {0: {"step": torch.tensor(1.0)}}, "param_groups": [{"lr": 0.1}]},
        "meta": {"rng": (3, (1, 2, 3), None), "seed": 0, "name": "run"},
    },
    "other containers inside plain ones": {
        "ordered": OrderedDict(b=1, a=[2, 3]),
        "default": defaultdict(list, k=[4]),
        "named": Point(x=[5], y={"z": 6}),
        "deque": deque([7, (8,)]),
    },
    "a plain container inside other ones": OrderedDict(a={"b": [1, (2, None)]}),
    "empty containers": {"d": {}, "l": [], "t": (), "n": None},
    "a leaf alone": torch.zeros(3),
    "non-string keys": {1: "one", (2, 3): "pair", None: "none"},
}


def _pytree_map(fn, tree, is_leaf=None):
    """torch's own walk, with paths named as shardwise names them."""

    def name(entry):
        for attribute in ("key", "idx", "name"):
            if hasattr(entry, attribute):
                return str(getattr(entry, attribute))
        return str(entry)

    return pytree.tree_map_with_path(
        lambda keys, leaf: fn(tuple(map(name, keys)), leaf), tree, is_leaf=is_leaf
    )


def _same(a, b) -> bool:
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple | deque):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize("name", TREES)
def test_map_with_path_gives_what_torchs_pytree_gives(name):
    tree = TREES[name]
    seen, expected = [], []
    mapped = map_with_path(lambda path, leaf: seen.append(path) or (path, leaf), tree)
    reference = _pytree_map(lambda path, leaf: expected.append(path) or (path, leaf), tree)
    assert seen == expected
    assert _same(mapped, reference)


def test_map_with_path_stops_where_is_leaf_says_so():
    tree = {"a": {"__ref__": "x"}, "b": [{"__ref__": "y"}, {"c": 1}], "d": OrderedDict(e=[2])}

    def is_ref(node):
        return isinstance(node, dict) and "__ref__" in node

    def fn(path, leaf):
        return "/".join(path)

    assert map_with_path(fn, tree, is_leaf=is_ref) == _pytree_map(fn, tree, is_leaf=is_ref)
    assert map_with_path(fn, tree, is_leaf=is_ref)["b"] == ["b/0", {"c": "b/1/c"}]
