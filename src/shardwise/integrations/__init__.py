"""Optional bridges between shardwise and other training frameworks.

Nothing here is imported by ``import shardwise``: each module is imported by name and needs
its framework installed, e.g. :mod:`shardwise.integrations.mmengine` (mmengine's
``FlexibleRunner`` training with shardwise's strategies).
"""
