"""The plain loop a hardware model runs for a data-dependent memory, with Python ints.

Encode the clean tensor, pack its words, encode their check bits with the textbook codes
of tests/ecc_reference.py, draw the pattern (asymmetric cells with those stored words, at
the trial's rate times their relative p10 / p01), flip, decode (a detected word read back
as 0 under policy "zero"), unpack, decode the values.
"""

from __future__ import annotations

import numpy as np

from bitfault.faults.patterns import Asymmetric, IndependentBits, MultiBitUpset
from ecc_reference import DUE, ref_check, ref_check_bits, ref_scheme


def reference_words(words, bits, word_bits, scheme, pattern, rate, seed, name):
    """(faulty element words as Python ints, counts): the plain loop over every word."""
    kind, policy = scheme.kind, getattr(scheme, "policy", "flag")
    k = word_bits // bits
    low = 2 ** bits - 1
    flat = [int(v) & low for v in np.asarray(words).ravel()]
    n_words = -(-len(flat) // k)
    data = [sum(flat[e] << (bits * (e - w * k)) for e in range(w * k, min(len(flat), w * k + k)))
            for w in range(n_words)]
    check = [ref_check(kind, d, word_bits) for d in data]
    if isinstance(pattern, Asymmetric):
        drawn = Asymmetric(rate * pattern.p10, rate * pattern.p01)
    else:
        drawn = type(pattern)(rate, pattern.sizes) if isinstance(pattern, MultiBitUpset) \
            else IndependentBits(rate)
    faults = drawn.draw(n_words, word_bits, ref_check_bits(kind, word_bits), seed=seed,
                        name=name, stored=(np.array(data, np.uint64), np.array(check, np.uint64)))
    out = list(flat)
    due = 0
    for w, dmask, cmask in zip(faults.indices.tolist(), faults.data.tolist(),
                               faults.check.tolist(), strict=True):
        got, status = ref_scheme(kind, data[w] ^ dmask, check[w] ^ cmask, word_bits, policy)
        due += status == DUE
        for e in range(w * k, min(len(flat), w * k + k)):
            out[e] = (got >> (bits * (e - w * k))) & low
    return out, {"due": due, "bit_errors": sum(int(m).bit_count() for m in faults.data)
                 + sum(int(m).bit_count() for m in faults.check)}


def reference_values(x, fmt, storage, rate, seed, name):
    words = fmt.encode(x, fmt.calibrate(x))
    out, counts = reference_words(words, fmt.bits, storage.layout.word_bits,
                                  storage.scheme("codes"), storage.pattern, rate, seed, name)
    container = words.dtype
    faulty = np.array(out, np.uint64).astype(f"u{container.itemsize}").view(container)
    return fmt.decode(faulty.reshape(x.shape), fmt.calibrate(x), dtype=x.dtype), counts
