"""A character-level GPT, nanoGPT-style, trained on the source of Python's standard library.

Everything it needs ships with Python: the text is the ``.py`` files beside the ``os``
module, read in sorted order, so every machine sees the same data. Train it with::

    shardwise train examples/gpt_fsdp.py --nproc-per-node 2 --work-dir work_dirs/gpt

Three pieces, top to bottom: the dataset (characters → ids), the model (a decoder-only
transformer whose ``forward`` returns ``dict(loss=...)``, so the runner's default train step
needs nothing more), and a hook that prints a sample of generated text when training ends.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import Dataset

from shardwise.registry import DATASETS, HOOKS, MODELS
from shardwise.runner import Hook

# The vocabulary: newline and the 95 printable ASCII characters; anything else becomes '?'.
CHARS = "\n" + "".join(chr(c) for c in range(32, 127))
VOCAB_SIZE = len(CHARS)


def encode(text: str) -> torch.Tensor:
    table = np.full(256, CHARS.index("?"), dtype=np.uint8)
    for i, c in enumerate(CHARS):
        table[ord(c)] = i
    raw = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8)
    return torch.from_numpy(table[raw].copy())


def decode(ids) -> str:
    return "".join(CHARS[int(i)] for i in ids)


def stdlib_text(max_chars: int) -> str:
    """The standard library's ``.py`` files, in sorted order, up to ``max_chars`` characters."""
    parts, total = [], 0
    for path in sorted(Path(os.__file__).parent.glob("*.py")):
        source = path.read_text(encoding="utf-8", errors="replace")
        parts.append(f"# {path.name}\n{source}\n")
        total += len(parts[-1])
        if total >= max_chars:
            break
    return "".join(parts)[:max_chars]


@DATASETS.register_module()
class StdlibChars(Dataset):
    """Blocks of ``block_size`` characters; item ``i`` is ``(x, y)`` with ``y`` = ``x`` shifted
    by one. The last ``val_fraction`` of the text is the ``'val'`` split."""

    def __init__(
        self,
        block_size: int = 64,
        max_chars: int = 2_000_000,
        split: str = "train",
        val_fraction: float = 0.05,
    ) -> None:
        if split not in ("train", "val"):
            raise ValueError(f"split must be 'train' or 'val', got {split!r}")
        data = encode(stdlib_text(max_chars))
        cut = int(len(data) * (1 - val_fraction))
        self.data = data[:cut] if split == "train" else data[cut:]
        self.block_size = block_size

    def __len__(self) -> int:
        return (len(self.data) - 1) // self.block_size

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunk = self.data[i * self.block_size : (i + 1) * self.block_size + 1].long()
        return chunk[:-1], chunk[1:]


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, dropout: float) -> None:
        super().__init__()
        self.n_head, self.head_dim, self.dropout = n_head, n_embd // n_head, dropout
        self.q, self.k, self.v = (nn.Linear(n_embd, n_embd) for _ in range(3))
        self.qkv = (self.q, self.k, self.v)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        # -1 heads: under tensor parallelism each rank holds n_head / tp of them
        q, k, v = (m(x).view(B, T, -1, self.head_dim).transpose(1, 2) for m in self.qkv)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
        return self.proj(y.transpose(1, 2).reshape(B, T, -1))


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


@MODELS.register_module()
class CharGPT(nn.Module):
    """A decoder-only transformer over characters.

    ``forward(idx, targets)`` returns ``dict(loss=cross_entropy)``; ``forward(idx)`` returns
    the logits of every position. Ready for pipeline parallelism (``examples/gpt_pp.py``):
    ``forward`` skips the modules a stage lacks, ``pipeline_split_points`` splits the blocks
    evenly and ``pipeline_loss`` is the loss on the last stage.
    """

    #: How tensor parallelism splits it (``tp_plan='auto'``): attention by heads, the MLP
    #: by its hidden units (Megatron's column-then-row pairs), the vocabulary of the embedding
    #: and the head; the head's logits are gathered whole for the loss.
    _tp_plan = {
        "tok_emb": "embedding_rowwise",
        "blocks.*.attn.q": "colwise",
        "blocks.*.attn.k": "colwise",
        "blocks.*.attn.v": "colwise",
        "blocks.*.attn.proj": "rowwise",
        "blocks.*.mlp.0": "colwise",
        "blocks.*.mlp.2": "rowwise",
        "head": "colwise_gather_output",
    }

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
        # Written to be split into pipeline stages (FSDPStrategy's parallelism=dict(pp=...)):
        # a stage runs the modules it has and skips those of other stages (set to None), so
        # a later stage takes the previous stage's activations in place of ``idx``.
        x = idx
        if self.tok_emb is not None:
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        if self.head is None:  # a stage before the last: its activations go on
            return x
        logits = self.head(self.ln_f(x) if self.ln_f is not None else x)
        if targets is None:
            return logits
        return dict(loss=self.pipeline_loss(logits, targets))

    def pipeline_split_points(self, n_stages: int) -> list[str]:
        """Where each of ``n_stages`` pipeline stages starts: the blocks split evenly (the
        embeddings go with the first stage, the final norm and the head with the last)."""
        n = len(self.blocks)
        if n_stages > n:
            raise ValueError(
                f"{n_stages} pipeline stages need at least {n_stages} blocks, but the model "
                f"has n_layer={n}; lower pp or stages_per_rank, or raise n_layer"
            )
        return [f"blocks.{i * n // n_stages}" for i in range(1, n_stages)]

    def pipeline_loss(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss of a pipeline's last stage (and of ``forward(idx, targets)``): the
        cross-entropy of every position's next character."""
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())

    @torch.no_grad()
    def generate(
        self,
        idx: torch.Tensor,
        max_new_tokens: int,
        temperature: float = 0.8,
        top_k: int = 20,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Extend ``idx`` (batch, time) by ``max_new_tokens`` sampled characters."""
        for _ in range(max_new_tokens):
            logits = self(idx[:, -self.block_size :])[:, -1, :] / temperature
            kth = torch.topk(logits, min(top_k, logits.shape[-1])).values[:, [-1]]
            logits[logits < kth] = -float("inf")
            probs = F.softmax(logits, dim=-1)
            idx = torch.cat([idx, torch.multinomial(probs, 1, generator=generator)], dim=1)
        return idx


@HOOKS.register_module()
class GenerateTextHook(Hook):
    """Print a sample of generated text when training ends (every rank generates, because a
    sharded model's forward is collective; rank 0 prints)."""

    priority = "LOWEST"

    def __init__(self, prompt: str = "def ", max_new_tokens: int = 250, seed: int = 0) -> None:
        self.prompt, self.max_new_tokens, self.seed = prompt, max_new_tokens, seed

    def after_train(self, runner) -> None:
        if getattr(runner.strategy, "pipeline", None) is not None:
            if runner.rank == 0:  # each rank holds only its stages: no whole model to sample
                print("GenerateTextHook: no sample, the model is split into pipeline stages")
            return
        model = runner.model
        was_training = model.training
        model.eval()
        device = runner.strategy.device
        generator = torch.Generator(device=device).manual_seed(self.seed)
        idx = encode(self.prompt).long()[None].to(device)
        module = getattr(model, "module", model)  # DDP keeps the model in .module
        out = module.generate(idx, self.max_new_tokens, generator=generator)
        model.train(was_training)
        if runner.rank == 0:
            bar = "-" * 72
            print(
                f"{bar}\nGenerated text (prompt {self.prompt!r}):\n{bar}\n{decode(out[0])}\n{bar}"
            )
