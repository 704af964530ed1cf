"""Reference models: the seed MLP and a small CNN, for PyTorch (``bitfault.models.torch``)
and Keras (``bitfault.models.keras``), with the same layer names in both so that tensor
names, and therefore fault maps, agree ("fc1.weight", "conv1.weight", ...).
"""
