# A small CNN with BatchNorm on scikit-learn's 8x8 digits, data parallel with synchronised
# BatchNorm:  shardwise train examples/digits_ddp.py --nproc-per-node 2
custom_imports = dict(imports=["digits_cnn"])  # examples/digits_cnn.py, beside this file

model = dict(type="DigitsCNN", width=32)
strategy = dict(type="DDPStrategy", sync_bn="torch")

train_dataloader = dict(
    dataset=dict(type="Digits", split="train"),
    batch_size=32,  # per process
    sampler=dict(type="DefaultSampler", shuffle=True),
)
val_dataloader = dict(
    dataset=dict(type="Digits", split="val"),
    batch_size=128,
    sampler=dict(type="DefaultSampler", shuffle=False),
)
val_evaluator = dict(type="Accuracy")

optim_wrapper = dict(optimizer=dict(type="AdamW", lr=3e-3, weight_decay=1e-4))
param_scheduler = [dict(type="CosineAnnealingLR", by_epoch=True, eta_min=1e-4)]

train_cfg = dict(by_epoch=True, max_epochs=12, val_interval=1)
val_cfg = dict()
default_hooks = dict(
    logger=dict(interval=10),
    checkpoint=dict(interval=4, max_keep_ckpts=2, save_best="accuracy"),
)
randomness = dict(seed=0)
