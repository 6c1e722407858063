"""The model every bench trains: the char-level GPT of ``examples/chargpt.py``.

When that example cannot be imported (it needs the runner's ``Hook``), an identical copy
below stands in, so the figures are of the same model either way: ``CharGPT(vocab_size,
block_size, n_layer, n_head, n_embd)``, ``forward(idx, targets) -> dict(loss=...)``, blocks
of class ``GPTBlock`` (the unit each FSDP bench shards on its own).

Sizes are named presets (:data:`PRESETS`); ``build_gpt(name, device='meta')`` builds on the
meta device for the sizes that would not fit twice in memory.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

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


# ----------------------------------------------------------------------------- fallback copy
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.dropout = n_head, dropout
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class GPTBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, dropout)
        self.mlp = nn.Sequential(
            nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd)
        )
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.drop(self.mlp(self.ln2(x)))


class CharGPT(nn.Module):
    def __init__(
        self,
        vocab_size: int = VOCAB_SIZE,
        block_size: int = 64,
        n_layer: int = 4,
        n_head: int = 4,
        n_embd: int = 128,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.block_size = block_size
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(GPTBlock(n_embd, n_head, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)
        self.init_weights()

    def init_weights(self) -> None:
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = (
                    0.02 / math.sqrt(2 * len(self.blocks)) if name.endswith("proj.weight") else 0.02
                )
                nn.init.normal_(p, std=std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits
        return dict(loss=F.cross_entropy(logits.flatten(0, 1), targets.flatten()))


# ----------------------------------------------------------------------------- selection
def _example_module():
    """``examples/chargpt.py`` as a module, or ``None`` when it is absent or cannot import."""
    path = REPO / "examples" / "chargpt.py"
    if "_bench_chargpt" in sys.modules:
        return sys.modules["_bench_chargpt"]
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("_bench_chargpt", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - the example is work in progress; fall back to the copy
        return None
    sys.modules["_bench_chargpt"] = module
    return module


def model_classes() -> tuple[type[nn.Module], type[nn.Module], str]:
    """``(CharGPT, GPTBlock, where they come from)``."""
    example = _example_module()
    if example is not None and hasattr(example, "CharGPT") and hasattr(example, "GPTBlock"):
        return example.CharGPT, example.GPTBlock, "examples/chargpt.py"
    return CharGPT, GPTBlock, "bench/_models.py (copy of examples/chargpt.py)"


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
