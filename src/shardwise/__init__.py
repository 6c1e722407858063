"""shardwise: training strategies for PyTorch (CPU, one GPU, DDP, FSDP2)."""

__version__ = "0.1.0"
