"""The work behind the ``bitfault`` command, callable from Python.

``train(config)`` trains one model per recipe into a run directory,
``run_campaign(run_dir)`` measures them under bit faults (resumable),
``make_report(run_dir)`` writes the report, ``inject_file(...)`` writes a faulty copy
of a saved model and ``demo()`` does all of it on the embedded MNIST digits. Each
imports PyTorch or Keras only when it needs it. The run directory layout is in
``bitfault.jobs.run_dir``.
"""

from bitfault.jobs.campaign import run_campaign
from bitfault.jobs.demo import DEMO_CONFIG, demo, demo_config
from bitfault.jobs.inject import inject_file
from bitfault.jobs.progress import Reporter
from bitfault.jobs.report import format_rate_table, make_report
from bitfault.jobs.run_dir import RunDir
from bitfault.jobs.train import train

__all__ = ["DEMO_CONFIG", "Reporter", "RunDir", "demo", "demo_config", "format_rate_table",
           "inject_file", "make_report", "run_campaign", "train"]
