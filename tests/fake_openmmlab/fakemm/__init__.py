"""A stand-in OpenMMLab package (its registries in mmengine's tree, scope ``fakemm``) for the
tests that need one without mmpretrain."""
