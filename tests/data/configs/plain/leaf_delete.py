_base_ = "./_base_/model.py"

model = dict(backbone=dict(_delete_=True, type="VisionTransformer", arch="b"))
extra = dict(_delete_=True, a=1, nested=[dict(_delete_=True, b=2)])
