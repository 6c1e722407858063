from shardwise_lazy_probe import Probe

model = dict(type=Probe, width=2)
