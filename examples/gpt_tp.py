# The character-level GPT with tensor parallelism: each block's attention split by heads and
# its MLP by hidden units over tp=2 ranks (CharGPT's own _tp_plan, read by tp_plan='auto'),
# fully sharded over the rest of the world (dp_shard=-1: 1 on 2 ranks, 2 on 4 ranks):
#   shardwise train examples/gpt_tp.py --nproc-per-node 2 --work-dir work_dirs/gpt_tp
# The two ranks of a tensor-parallel pair read the same batches (batch_size is per pair).
_base_ = "./gpt_base.py"

strategy = dict(
    type="FSDPStrategy",
    parallelism=dict(dp_shard=-1, tp=2),
    tp_plan="auto",
    model_wrapper=dict(auto_wrap_policy=["GPTBlock"]),
)
