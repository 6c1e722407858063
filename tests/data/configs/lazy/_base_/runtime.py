from torch.optim import SGD

default_hooks = dict(timer=dict(type="IterTimerHook"), logger=dict(type="LoggerHook"))
optim_wrapper = dict(optimizer=dict(type=SGD, lr=0.1, momentum=0.9))
train_cfg = dict(by_epoch=True, max_epochs=5, val_interval=1)
