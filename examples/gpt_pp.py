# The character-level GPT with pipeline parallelism: its blocks split evenly into pp=2 stages
# (CharGPT.pipeline_split_points: the embeddings and blocks 0-1 on the first rank, blocks 2-3,
# the final norm and the head on the second), run by torch's 1F1B schedule over 4 microbatches
# of each batch; each stage fully sharded over the rest of the world (dp_shard=-1: 1 on 2
# ranks, 2 on 4 ranks):
#   shardwise train examples/gpt_pp.py --nproc-per-node 2 --work-dir work_dirs/gpt_pp
# The loss is computed on the last stage (CharGPT.pipeline_loss) and logged on every rank.
# No validation and no generated sample: each rank holds only its stage, and the validation
# loop runs a whole model. Its sharded checkpoint loads without stages (gpt_fsdp.py,
# gpt_single.py): the stages save the unsplit model's names.
_base_ = "./gpt_base.py"

strategy = dict(
    type="FSDPStrategy",
    parallelism=dict(pp=2, dp_shard=-1),
    pipeline=dict(schedule="1F1B", n_microbatches=4),
    model_wrapper=dict(auto_wrap_policy=["GPTBlock"]),
)
train_cfg = dict(_delete_=True, by_epoch=False, max_iters=500)  # no val_interval
val_dataloader = None
val_cfg = None
val_evaluator = None
