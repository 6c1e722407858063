# The character-level GPT on one device (a GPU when there is one, else the CPU):
#   shardwise train examples/gpt_single.py --work-dir work_dirs/gpt_single
_base_ = "./gpt_base.py"

strategy = dict(type="SingleDeviceStrategy")
