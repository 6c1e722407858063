"""The model every bench trains: the char-level GPT of ``examples/chargpt.py``.

``CharGPT(vocab_size, block_size, n_layer, n_head, n_embd)``, ``forward(idx, targets) ->
dict(loss=...)``, blocks of class ``GPTBlock`` (the unit each FSDP bench shards on its own).

Sizes are named presets (:data:`PRESETS`); ``build_gpt(name, device='meta')`` builds on the
meta device for the sizes that would not fit twice in memory.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

REPO = Path(__file__).resolve().parents[1]
VOCAB_SIZE = 96  # newline and the 95 printable ASCII characters, as in examples/chargpt.py


@dataclass(frozen=True)
class GPTSize:
    n_layer: int
    n_head: int
    n_embd: int
    block_size: int = 64
    vocab_size: int = VOCAB_SIZE


PRESETS: dict[str, GPTSize] = {
    "small": GPTSize(n_layer=4, n_head=4, n_embd=128),  # ~0.8M: the overhead bench
    "10M": GPTSize(n_layer=12, n_head=8, n_embd=256),
    "25M": GPTSize(n_layer=8, n_head=8, n_embd=512),
    "50M": GPTSize(n_layer=16, n_head=8, n_embd=512),
    "100M": GPTSize(n_layer=14, n_head=12, n_embd=768),
    "1B": GPTSize(n_layer=20, n_head=16, n_embd=2048),
}


# ----------------------------------------------------------------------------- the model
def _example_module():
    """``examples/chargpt.py`` as a module (the bench measures the example's own model)."""
    if "_bench_chargpt" in sys.modules:
        return sys.modules["_bench_chargpt"]
    spec = importlib.util.spec_from_file_location(
        "_bench_chargpt", REPO / "examples" / "chargpt.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sys.modules["_bench_chargpt"] = module
    return module


def model_classes() -> tuple[type[nn.Module], type[nn.Module], str]:
    """``(CharGPT, GPTBlock, where they come from)``."""
    example = _example_module()
    return example.CharGPT, example.GPTBlock, "examples/chargpt.py"


def block_class() -> type[nn.Module]:
    return model_classes()[1]


def build_gpt(size: str | GPTSize, *, device: str | torch.device = "cpu", seed: int = 0):
    """A CharGPT of a preset size; on ``device='meta'`` nothing is allocated or initialised."""
    cfg = PRESETS[size] if isinstance(size, str) else size
    cls = model_classes()[0]
    torch.manual_seed(seed)
    with torch.device(device):
        return cls(**asdict(cfg))


def materialize(model: nn.Module, device: str | torch.device = "cpu", seed: int = 0) -> nn.Module:
    """Allocate a meta-built model on ``device`` and initialise its weights in place."""
    model.to_empty(device=device)
    torch.manual_seed(seed)
    model.init_weights()
    return model


def count_params(size: str | GPTSize) -> int:
    """The parameter count of a preset, computed on the meta device."""
    return sum(p.numel() for p in build_gpt(size, device="meta").parameters())


def make_batches(
    n: int, batch: int, size: str | GPTSize, *, seed: int = 0
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``n`` fixed batches of random character ids ``(x, y)``; ``y`` is ``x`` shifted by one."""
    cfg = PRESETS[size] if isinstance(size, str) else size
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        seq = torch.randint(cfg.vocab_size, (batch, cfg.block_size + 1), generator=gen)
        out.append((seq[:, :-1].contiguous(), seq[:, 1:].contiguous()))
    return out


def loss_of(model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    x, y = batch
    return model(x, y)["loss"]


def raw_step_fn(model: nn.Module, optimizer: torch.optim.Optimizer, batches: list) -> Any:
    """The raw PyTorch floor: ``step(i)`` trains on batch ``i`` and returns the loss."""

    def step(i: int) -> torch.Tensor:
        loss = loss_of(model, batches[i % len(batches)])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        return loss

    return step


def shardwise_step_fn(model: nn.Module, optim_wrapper: Any, batches: list) -> Any:
    """The same step through a shardwise optimizer wrapper."""

    def step(i: int) -> torch.Tensor:
        with optim_wrapper.optim_context(model):
            loss = loss_of(model, batches[i % len(batches)])
        optim_wrapper.update_params(loss)
        return loss

    return step
