"""The Checkpointer is a collaborator over state objects: any object with ``state_dict()`` /
``load_state_dict()`` is saved and resumed, whoever registers it, without a strategy."""

from __future__ import annotations

import pytest
import torch

from shardwise.checkpoint import CheckpointError
from shardwise.checkpoint.checkpointer import Checkpointer, Layout
from shardwise.checkpoint.formats import FULL, read_checkpoint


class Counter:
    """A caller's own state: a plain object with torch's Stateful protocol."""

    def __init__(self) -> None:
        self.value = 0

    def state_dict(self) -> dict[str, int]:
        return {"value": self.value}

    def load_state_dict(self, state_dict: dict[str, int]) -> None:
        self.value = state_dict["value"]


class Position(Counter):
    """A part of ``meta`` (as a runner's loop position is)."""

    def state_dict(self) -> dict[str, int]:
        return {"iter": self.value}

    def load_state_dict(self, meta: dict[str, int]) -> None:
        self.value = meta.get("iter", self.value)  # a part of meta copes with its absence


def _step(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    loss = model(torch.ones(2, 3)).pow(2).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def _checkpointer(tmp_path, model, optimizer, counter, position) -> Checkpointer:
    checkpointer = Checkpointer(
        tmp_path, {"state_dict": model, "optimizer": optimizer}, Layout(FULL)
    )
    checkpointer.register("counter", counter)
    checkpointer.register("position", position, meta=True)
    return checkpointer


def test_plain_torch_objects_and_the_callers_states_save_and_resume(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    counter, position = Counter(), Position()
    checkpointer = _checkpointer(tmp_path, model, optimizer, counter, position)
    _step(model, optimizer)
    counter.value, position.value = 7, 3
    checkpointer.save("iter_3.pth")
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    moments = optimizer.state_dict()["state"][0]["exp_avg"].clone()

    on_disk = read_checkpoint(tmp_path / "iter_3.pth")
    assert on_disk["counter"] == {"value": 7} and on_disk["meta"]["iter"] == 3
    assert set(on_disk) == {"state_dict", "optimizer", "counter", "meta"}

    _step(model, optimizer)
    counter.value, position.value = 0, 0
    rest = checkpointer.resume("iter_3.pth")
    assert all(torch.equal(model.state_dict()[k], v) for k, v in saved.items())
    assert torch.equal(optimizer.state_dict()["state"][0]["exp_avg"], moments)
    assert (counter.value, position.value) == (7, 3)
    assert rest["meta"]["format"] == "full"


def test_a_resume_without_a_required_entry_loads_nothing(tmp_path):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    Checkpointer(tmp_path, {"state_dict": model}, Layout(FULL)).save("weights.pth")
    counter = Counter()
    checkpointer = _checkpointer(tmp_path, model, optimizer, counter, Position())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1)
    with pytest.raises(KeyError, match="has no optimizer state"):
        checkpointer.resume("weights.pth")
    assert not torch.equal(model.weight, before["weight"])  # nothing was loaded
    checkpointer.unregister("counter")
    checkpointer.resume("weights.pth", resume_optimizer=False)
    assert torch.equal(model.weight, before["weight"])


def test_an_optional_entry_may_be_absent(tmp_path):
    model = torch.nn.Linear(3, 2)
    Checkpointer(tmp_path, {"state_dict": model}, Layout(FULL)).save("weights.pth")
    checkpointer = Checkpointer(tmp_path, {"state_dict": model}, Layout(FULL))
    counter = Counter()
    counter.value = 5
    checkpointer.register("counter", counter, required=False)
    checkpointer.resume("weights.pth", resume_optimizer=False)
    assert counter.value == 5  # left as it was


def test_a_state_that_does_not_fit_refuses_the_resume_before_anything_loads(tmp_path):
    class Picky(Counter):
        def fit_state_dict(self, saved):
            return saved, [] if saved["value"] > 0 else ["counter: the saved value is not > 0"]

    model = torch.nn.Linear(3, 2)
    checkpointer = Checkpointer(tmp_path, {"state_dict": model}, Layout(FULL))
    checkpointer.register("counter", Picky())
    checkpointer.save("zero.pth")
    with torch.no_grad():
        model.weight.zero_()
    with pytest.raises(CheckpointError, match="the saved value is not > 0"):
        checkpointer.resume("zero.pth", resume_optimizer=False)
    assert not model.weight.any()  # the model was not loaded either


class PickyOnRank1(Counter):
    """Fits everywhere but on rank 1 (a pipeline stage's part of a checkpoint may not fit)."""

    def fit_state_dict(self, saved):
        import torch.distributed as dist

        return saved, ["counter: rank 1's part does not fit"] * (dist.get_rank() == 1)

    def load_state_dict(self, state_dict):
        import torch.distributed as dist

        dist.barrier()  # a collective, as a sharded load has: a rank alone here would hang
        super().load_state_dict(state_dict)


def _resume_refused_on_rank1(work_dir):
    import torch.distributed as dist

    model = torch.nn.Linear(3, 2)
    layout = Layout(FULL, rank=dist.get_rank())
    checkpointer = Checkpointer(work_dir, {"state_dict": model}, layout)
    checkpointer.register("counter", PickyOnRank1())
    checkpointer.save("c.pth")
    try:
        checkpointer.resume("c.pth", resume_optimizer=False)
    except CheckpointError as exc:
        return str(exc)
    return None


def test_a_resume_refused_on_one_rank_is_refused_on_every_rank_without_a_hang(tmp_path):
    from tests.distributed import run_distributed

    errors = run_distributed(_resume_refused_on_rank1, 2, str(tmp_path), init_pg=True, timeout=60)
    assert "rank 1's part does not fit" in errors[1]
    assert "failed on rank 1" in errors[0] and "rank 1's part does not fit" in errors[0]


def test_registering_refuses_what_is_not_stateful_and_the_meta_key(tmp_path):
    checkpointer = Checkpointer(tmp_path)
    with pytest.raises(TypeError, match="has no state_dict"):
        checkpointer.register("seed", 3)
    with pytest.raises(ValueError, match="meta=True"):
        checkpointer.register("meta", Counter())
    with pytest.raises(RuntimeError, match="call prepare"):
        checkpointer.save("x.pth")
    assert not list(tmp_path.iterdir())


def test_extras_may_not_overwrite_a_registered_entry(tmp_path):
    model = torch.nn.Linear(3, 2)
    checkpointer = Checkpointer(tmp_path, {"state_dict": model}, Layout(FULL))
    with pytest.raises(ValueError, match=r"extra_ckpt keys \['state_dict'\]"):
        checkpointer.save("x.pth", extra_ckpt={"state_dict": {}})
    assert not (tmp_path / "x.pth").exists()


def test_one_detection_names_every_format_and_a_safetensors_export_loads_as_weights(tmp_path):
    from shardwise.checkpoint.convert import convert_checkpoint
    from shardwise.checkpoint.formats import SAFETENSORS, detect_format, open_checkpoint

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    Checkpointer(tmp_path, {"state_dict": model}, Layout(FULL)).save("full.pth")
    convert_checkpoint(tmp_path / "full.pth", tmp_path / "w.safetensors", to="safetensors")
    assert detect_format(tmp_path / "full.pth", probe=True) is FULL
    assert detect_format(tmp_path / "w.safetensors", probe=True) is SAFETENSORS
    opened = open_checkpoint(tmp_path / "w.safetensors")
    assert opened.format is SAFETENSORS
    assert sorted(i.name for i in opened.tensors()) == ["bias", "weight"]

    other = torch.nn.Linear(3, 2)
    Checkpointer(tmp_path, {"state_dict": other}, Layout(FULL)).load("w.safetensors", strict=True)
    assert all(torch.equal(other.state_dict()[k], v) for k, v in model.state_dict().items())
