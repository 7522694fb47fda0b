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
        # Loaded from beside this folder, not through `import trainguard`: the package's own imports
        # would cost every Python process of the run (a worker, a helper) tens of milliseconds, and an
        # interpreter without trainguard installed still gets its stacks dumped on a signal. The contract
        # (environment names) first: it imports nothing, the other two import it.
        import importlib.machinery  # frozen, already loaded: importlib.util would import contextlib & co

        package = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        for full in ("trainguard.contract", "trainguard.probe.stackdump", "trainguard.probe.auto"):
            if full == "trainguard.probe.stackdump":
                contract = sys.modules["trainguard.contract"]
                if os.environ.get(contract.ENV_AUTO, "1") == "0" or not os.environ.get(contract.ENV_RUN_DIR):
                    return
            if full not in sys.modules:
                path = os.path.join(package, *full.split(".")[1:]) + ".py"
                loader = importlib.machinery.SourceFileLoader(full, path)
                module = type(sys)(full)
                module.__file__, module.__loader__ = path, loader
                module.__spec__ = importlib.machinery.ModuleSpec(full, loader, origin=path)
                sys.modules[full] = module
                try:
                    loader.exec_module(module)
                except BaseException:
                    del sys.modules[full]
                    raise
        sys.modules["trainguard.probe.auto"].boot()
    except Exception:
        pass  # broken: the program runs as is


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
