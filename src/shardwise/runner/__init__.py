"""The Runner: training and validation loops, hooks, and the ``shardwise train`` command."""

__all__: list[str] = []
