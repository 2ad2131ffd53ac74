"""Work-arounds for platform bugs that fairfl's processes can hit."""

from __future__ import annotations

import ast
import sys
import threading


def serialize_ast_parse() -> bool:
    """Make ast.parse thread-safe on CPython versions with gh-106905.

    CPython 3.11.0-3.11.7 and 3.12.0 keep the AST constructor's recursion depth in per-interpreter state, so
    ast.parse in two threads at once can fail with "SystemError: AST constructor recursion depth mismatch".
    An NVFlare server decodes the sites' numpy arrays in parallel threads, and numpy parses each array
    header with ast.literal_eval (which calls ast.parse): one such failure ended a 6-site benchmark job.
    A lock around ast.parse removes the interleaving. Returns whether the lock was installed."""
    affected = (3, 11) <= sys.version_info[:3] < (3, 11, 8) or sys.version_info[:3] == (3, 12, 0)
    if not affected or getattr(ast.parse, "_fairfl_serialized", False):
        return False
    lock, parse = threading.Lock(), ast.parse

    def serialized_parse(*args, **kwargs):
        with lock:
            return parse(*args, **kwargs)

    serialized_parse._fairfl_serialized = True
    ast.parse = serialized_parse  # ast.literal_eval looks `parse` up in the module at each call
    return True
