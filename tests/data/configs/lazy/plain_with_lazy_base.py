_base_ = "./_base_/runtime.py"
