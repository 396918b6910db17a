"""Loads a repository script that is not part of the package (bench/*.py, dev/cuda/*.py) by its
path, for the tests of those tools."""
import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_script(relpath, siblings=False):
    """The module of ROOT/relpath; siblings=True lets it import the scripts beside it."""
    path = ROOT / relpath
    if siblings:
        sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        if siblings:
            sys.path.remove(str(path.parent))
