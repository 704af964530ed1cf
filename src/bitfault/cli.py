"""The ``bitfault`` command line.

Today it offers ``--version`` and ``map`` (draw a fault map and save it as npz);
``demo``, ``train``, ``campaign``, ``report`` and ``inject`` arrive with the CLI
issue. Exit codes: 0 on success, 2 with a one-line cause on bad input.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

import bitfault
from bitfault.faults import BitFlip
from bitfault.formats import format_from_dict
from bitfault.maps import FaultMap


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bitfault", description=bitfault.__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"bitfault {bitfault.__version__}")
    sub = parser.add_subparsers(dest="command")
    m = sub.add_parser("map", help="draw a random fault map and save it as .npz")
    m.add_argument("output", help="the .npz file to write")
    m.add_argument("--shape", required=True, help="tensor shape in PyTorch layout, e.g. 256,784")
    m.add_argument("--name", required=True, help='tensor name, e.g. "fc1.weight"')
    m.add_argument("--format", default='{"kind": "fixed_point", "bits": 32, "frac": 28, '
                   '"rounding": "trunc"}', help="format as JSON (see Format.to_dict())")
    group = m.add_mutually_exclusive_group(required=True)
    group.add_argument("--ber", type=float, help="bit error rate in [0, 1]")
    group.add_argument("--count", type=int, help="exact number of faulty bits")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--bits", default=None, help='eligible bits: positions or fields, e.g. "msb"')
    m.add_argument("--json", action="store_true", help="print a JSON summary")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command is None:
        _parser().print_help()
        return 0
    try:
        shape = tuple(int(d) for d in args.shape.split(","))
        fmt = format_from_dict(json.loads(args.format))
        bits = None
        if args.bits:
            bits = [int(b) if b.strip().isdigit() else b.strip() for b in args.bits.split(",")]
        fmap = FaultMap.random(shape, fmt, ber=args.ber, count=args.count, seed=args.seed,
                               name=args.name, bits=bits, fault=BitFlip())
        fmap.save(args.output)
    except (ValueError, TypeError, OSError) as exc:
        print(f"bitfault: error: {exc}", file=sys.stderr)
        return 2
    summary = {"output": args.output, "name": fmap.name, "shape": list(fmap.shape),
               "faults": fmap.n_faults, "elements": fmap.n_elements, "digest": fmap.digest()}
    print(json.dumps(summary) if args.json else
          f"wrote {args.output}: {fmap.n_faults} faulty bits in {fmap.n_elements} elements "
          f"of {args.name} {fmap.shape}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
