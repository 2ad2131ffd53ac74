"""Loaded by every Python process started with this folder first on PYTHONPATH (benchmarks/round_threads.py puts it
there for the simulator's processes only): once `fairfl.flare.executor` is imported, its executor's `execute` (a whole
task at a site, as NVFlare hands it over) and `_train` (the local training step the cost floors call too) append, per
call, the calling thread's CPU seconds and its start and end to $FAIRFL_TASK_CPU_LOG/<pid>.jsonl. Nothing else
changes; without $FAIRFL_TASK_CPU_LOG it does nothing. Being first on PYTHONPATH, it stands in for any
sitecustomize of the environment (this project's has none)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import os
import sys
import threading
import time

TARGET = "fairfl.flare.executor"
LOG_DIR = os.environ.get("FAIRFL_TASK_CPU_LOG")


def timed(name, method):
    def wrapper(self, *args, **kwargs):
        cpu, started = time.thread_time(), time.time()
        try:
            return method(self, *args, **kwargs)
        finally:
            record = {
                "what": name,
                "pid": os.getpid(),
                "tid": threading.get_native_id(),
                "start": started,
                "end": time.time(),
                "cpu": time.thread_time() - cpu,
            }
            try:  # a full disk loses a record, never the task
                with open(os.path.join(LOG_DIR, f"{os.getpid()}.jsonl"), "a") as log:
                    log.write(json.dumps(record) + "\n")
            except OSError:
                pass

    return wrapper


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def __getattr__(self, name):  # get_source, get_code, ...: tracebacks keep the executor's source lines
        return getattr(self.loader, name)

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        executor = module.FairflExecutor
        executor.execute = timed("execute", executor.execute)
        executor._train = timed("_train", executor._train)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if LOG_DIR:
    sys.meta_path.insert(0, _Finder())
