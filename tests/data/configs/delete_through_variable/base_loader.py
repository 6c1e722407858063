# A base with a dataset that has keys a child replaces wholesale (``_delete_=True``).
train_dataloader = dict(
    batch_size=4,
    num_workers=2,
    dataset=dict(
        type="ToyVideoDataset",
        ann_file="toy/train_list.txt",
        data_prefix=dict(video="toy/videos"),
        pipeline=[dict(type="DecodeFrames")],
    ),
)
val_dataloader = dict(batch_size=1, dataset=dict(type="ToyVideoDataset", ann_file="toy/val.txt"))
