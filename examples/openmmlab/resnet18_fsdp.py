# resnet18.py under FSDP2 (each rank holds a shard of the weights and optimizer state):
#   .venv/bin/shardwise train examples/openmmlab/resnet18_fsdp.py --nproc-per-node 2 \
#       --work-dir work_dirs/resnet18_fsdp
_base_ = "./resnet18.py"
strategy = dict(type="FSDPStrategy")
