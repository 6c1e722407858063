# The character-level GPT, fully sharded over the processes (FSDP2; each GPTBlock is its own
# shard unit):  shardwise train examples/gpt_fsdp.py --nproc-per-node 2 --work-dir work_dirs/gpt
_base_ = "./gpt_base.py"

strategy = dict(type="FSDPStrategy", model_wrapper=dict(auto_wrap_policy=["GPTBlock"]))
