"""The TensorFlow kernels of bitfault.keras, one module per format family: ``scalar``
(FixedPoint, IntQuant, Float), ``minifloat`` (small-float codecs), ``blocks`` (MX, NVFP4,
GGUF, GroupwiseInt)."""
