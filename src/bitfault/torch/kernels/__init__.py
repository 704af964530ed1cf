"""The arithmetic behind ``bitfault.torch.seam``: ``generic`` (every format and float dtype,
in tensor ops), ``float32`` (the fast paths training uses), ``numba`` (compiled one-pass
CPU loops). Each computes the bits ``bitfault.inject`` computes; none chooses a kernel."""
