model = dict(
    type="ImageClassifier",
    backbone=dict(type="ResNet", depth=50, norm_eval=False, out_indices=(3,)),
    neck=dict(type="GlobalAveragePooling"),
    head=dict(type="LinearClsHead", num_classes=1000, in_channels=2048),
)
neck = dict(type="FPN", in_channels=[256, 512])
img_size = 224
