# The dataset is built in a module-level variable that carries ``_delete_=True`` and reaches
# ``train_dataloader.dataset`` only through that variable: mmengine replaces the base's
# dataset (its ``ann_file`` and ``data_prefix`` are gone), it does not merge into it.
_base_ = ["./base_loader.py"]

part_a = dict(type="ToyVideoDataset", ann_file="toy/a.txt", pipeline=[])
part_b = dict(type="ToyVideoDataset", ann_file="toy/b.txt", pipeline=[])
concat_trainset = dict(type="ConcatDataset", datasets=[part_a, part_b], _delete_=True)

train_dataloader = dict(batch_size=8, dataset=concat_trainset)
# the same variable reaching a second key: both places are replaced, neither merged
val_dataloader = dict(dataset=concat_trainset)
