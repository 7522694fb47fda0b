"""trainguard's start-up bootstrap (see trainguard/probe/auto.py): `trainguard run` puts this folder first
on PYTHONPATH, so every Python process of the run imports this module while the interpreter starts.

It loads the automatic probe (stacks on a signal; torch's global optimizer hooks once torch is
imported), then runs the `sitecustomize` this one shadows, if there is one, exactly as the interpreter
would have. Fail-open: nothing here may stop the user's program from starting.
"""

import os
import sys


def _trainguard_boot():
    try:
        from trainguard.probe import auto

        auto.boot()
    except Exception:
        pass  # trainguard not importable here (another interpreter), or broken: the program runs as is


def _chain_sitecustomize():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    except Exception:
        return
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        # what site.py itself prints for a failing sitecustomize
        print(f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: {exc}",
              file=sys.stderr)


_trainguard_boot()
_chain_sitecustomize()
