# ResNet-18 (CIFAR variant) from the config mmpretrain ships, on the image folders that
# make_images.py writes (data/train/<class>/*.png, data/val/<class>/*.png): 3 classes, 2 epochs,
# validation (accuracy/top1) after each. Run from the repository root:
#   .venv/bin/shardwise train examples/openmmlab/resnet18.py --work-dir work_dirs/resnet18
_base_ = "mmpretrain::resnet/resnet18_8xb16_cifar10.py"  # mmpretrain's config, as it ships

model = dict(head=dict(num_classes=3))
data_preprocessor = dict(num_classes=3, to_rgb=True)  # image files load as BGR, CIFAR-10 as RGB
train_pipeline = [
    dict(type="LoadImageFromFile"),  # CIFAR-10's pipeline starts from arrays
    dict(type="RandomCrop", crop_size=32, padding=4),
    dict(type="RandomFlip", prob=0.5, direction="horizontal"),
    dict(type="PackInputs"),
]
test_pipeline = [dict(type="LoadImageFromFile"), dict(type="PackInputs")]
# _delete_: a folder of images in the place of the CIFAR10 dataset, none of its keys kept
train_dataloader = dict(
    dataset=dict(
        _delete_=True, type="CustomDataset", data_root="data/train", pipeline=train_pipeline
    )
)
val_dataloader = dict(
    dataset=dict(_delete_=True, type="CustomDataset", data_root="data/val", pipeline=test_pipeline)
)
test_dataloader = val_dataloader
train_cfg = dict(max_epochs=2, val_interval=1)
default_hooks = dict(logger=dict(interval=2))
randomness = dict(seed=0)
