# A character-level GPT on the source of Python's standard library (examples/chargpt.py).
# gpt_fsdp.py and gpt_single.py inherit everything here and add only the strategy.
custom_imports = dict(imports=["chargpt"])  # examples/chargpt.py, beside this file

model = dict(type="CharGPT", block_size=64, n_layer=4, n_head=4, n_embd=128)

train_dataloader = dict(
    dataset=dict(type="StdlibChars", block_size=64, split="train"),
    batch_size=32,  # sequences of 64 characters, per process
)
val_dataloader = dict(
    dataset=dict(type="StdlibChars", block_size=64, split="val"),
    batch_size=64,
)
val_evaluator = dict(type="MeanLoss")

optim_wrapper = dict(
    optimizer=dict(type="AdamW", lr=2e-3, betas=(0.9, 0.99), weight_decay=0.1),
    clip_grad=dict(max_norm=1.0),
)
param_scheduler = [
    dict(type="LinearLR", start_factor=0.05, by_epoch=False, end=50),  # warm-up
    dict(type="CosineAnnealingLR", by_epoch=False, begin=50, eta_min=2e-4),  # until max_iters
]

train_cfg = dict(by_epoch=False, max_iters=500, val_interval=250)
val_cfg = dict()
default_hooks = dict(
    logger=dict(interval=50),
    checkpoint=dict(by_epoch=False, interval=250, max_keep_ckpts=1),
)
custom_hooks = [dict(type="GenerateTextHook", prompt="def ", max_new_tokens=250)]
randomness = dict(seed=0)
