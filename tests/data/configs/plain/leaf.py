_base_ = [
    "./_base_/model.py",
    "./_base_/data.py",
    "./_base_/schedule.yaml",
    "./_base_/runtime.json",
]
import copy  # noqa: E402  (after _base_: the config stays a plain one)

# {{_base_.x}} of any type anywhere in a literal
augment = dict(type="RandAugment", policies={{_base_.policies}}, prob=0.5)
heads = [{{_base_.model.head}}, dict(type="AuxHead")]
sizes = ({{_base_.img_size}}, {{_base_.img_size}})
name = "{{ fileBasenameNoExtension }}"
data_root = "{{$SHARDWISE_TEST_DATA_ROOT:data/imagenet}}"

# assignments into base variables, and reads of them later
_base_.train_cfg.max_epochs = 200
_base_.model.backbone.norm_eval = True
_base_.model.backbone.update(dict(frozen_stages=1))
max_epochs = _base_.train_cfg.max_epochs * 2
fpn = _base_.pop("neck")

# a plain dict put into a base is copied there: changing it afterwards does not reach it
crop = dict(type="RandomResizedCrop", scale=160)
_base_.train_dataloader.dataset.pipeline = [dict(type="LoadImageFromFile"), crop]
crop["scale"] = 192
# a base's dicts are ConfigDicts, shared wherever they are put: a change reaches every place
pipeline = copy.deepcopy(_base_.train_pipeline)
_base_.train_dataloader.dataset.val_pipeline = pipeline
pipeline[1]["scale"] = 256
_base_.train_pipeline[0]["backend"] = "pillow"
val_dataloader = dict(batch_size=64, dataset=dict(pipeline=_base_.train_pipeline))
test_dataloader = val_dataloader

# the leaf's own keys merge over the bases'
optim_wrapper = dict(optimizer=dict(lr=0.01), clip_grad=dict(_delete_=True, max_norm=1.0))
model = dict(head=dict(num_classes=10))
