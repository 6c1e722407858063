policies = [
    dict(type="AutoContrast"),
    dict(type="Rotate", magnitude_range=(0, 30)),
]
train_pipeline = [
    dict(type="LoadImageFromFile"),
    dict(type="RandomResizedCrop", scale=224),
    dict(type="PackInputs"),
]
train_dataloader = dict(
    batch_size=32,
    dataset=dict(type="ImageNet", data_root="data/imagenet", pipeline=train_pipeline),
)
