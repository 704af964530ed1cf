"""The arithmetic behind ``bitfault.torch.seam``, one module per format family, each
registering its kernels by format type (``registry``): ``fixed``, ``intquant``, ``floats``
(encode and decode in tensor ops, and float32 fast paths), ``blocks`` and
``block_formats`` (the block formats' planes), ``numba`` and ``block_numba`` (the compiled
CPU loops, registered beside them); ``generic`` holds the shared tensor arithmetic and
the generic path; ``device``: the fault positions every kernel reads. Each computes the
bits ``bitfault.inject`` computes; none chooses a kernel."""

from bitfault.torch.kernels import (  # noqa: F401 (each registers its kernels)
    block_formats,
    block_numba,
    blocks,
    fixed,
    floats,
    intquant,
    numba,
)
