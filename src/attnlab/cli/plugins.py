"""``--plugin``: import the user's modules that register attention parts, by module name
(looked up in the current folder first, as ``python -m`` does) or by the path of a ``.py``
file. A plugin that cannot be found or fails while importing is one ``ConfigError`` naming
its file and line, with the error it raised."""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from attnlab.config import ConfigError

EXAMPLE = "e.g. --plugin my_variants for my_variants.py in the current folder, or its path"


def import_plugins(plugins: Sequence[str]) -> None:
    """Import each of ``plugins`` (module names or ``.py`` paths), in order."""
    if plugins and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    for plugin in plugins:
        if _is_path(plugin):
            _import_file(plugin, Path(plugin))
        else:
            _import_module(plugin)


def _is_path(plugin: str) -> bool:
    """A path, not a module name: a ``.py`` name, anything but dotted identifiers, or an
    existing file."""
    return (plugin.endswith(".py") or not all(p.isidentifier() for p in plugin.split("."))
            or Path(plugin).is_file())


def _import_module(name: str) -> None:
    try:
        spec = importlib.util.find_spec(name)  # imports the parent packages of a.b.c
    except Exception as err:
        if not (isinstance(err, ModuleNotFoundError) and _names_the_plugin(err, name)):
            _failed(name, None, err)  # a parent package's own import failed
        spec = None
    if spec is not None and spec.origin is None:  # a folder without __init__.py
        raise ConfigError(f"--plugin {name}: a folder, not a module (nothing in it would "
                          f"run); {EXAMPLE}")
    if spec is None:
        raise ConfigError(f"--plugin {name}: cannot import it: there is no module {name} on "
                          f"the Python path (the current folder first); {EXAMPLE}")
    try:
        importlib.import_module(name)
    except Exception as err:
        _failed(name, spec.origin, err)


def _names_the_plugin(err: ModuleNotFoundError, name: str) -> bool:
    """Whether ``err`` says that ``name`` itself (or its package) is missing, rather than
    something the plugin imports."""
    return err.name is not None and (name == err.name or name.startswith(f"{err.name}."))


def _import_file(plugin: str, path: Path) -> None:
    """Import the ``.py`` file ``path`` as module ``path.stem``."""
    if path.is_dir():
        raise ConfigError(f"--plugin {plugin}: a folder; give a module name or a .py file, "
                          f"{EXAMPLE}")
    if not path.is_file():
        raise ConfigError(f"--plugin {plugin}: {path} does not exist; give a module name or "
                          f"the path of a .py file, {EXAMPLE}")
    if path.suffix != ".py":
        raise ConfigError(f"--plugin {plugin}: {path} is not a .py file; give a Python source "
                          f"file or a module name, {EXAMPLE}")
    name, origin = path.stem, str(path.resolve())
    known = sys.modules.get(name)
    if known is not None:
        if getattr(known, "__file__", None) == origin:
            return
        raise ConfigError(f"--plugin {plugin}: a module named {name} is already imported "
                          f"(from {getattr(known, '__file__', None) or 'Python itself'}); "
                          "rename the file")
    spec = importlib.util.spec_from_file_location(name, origin)
    if spec is None or spec.loader is None:
        raise ConfigError(f"--plugin {plugin}: Python cannot load {path} as a module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # as an import does: its classes can find their module
    try:
        spec.loader.exec_module(module)
    except Exception as err:
        del sys.modules[name]
        _failed(plugin, origin, err)


def _failed(plugin: str, origin: str | None, err: Exception) -> NoReturn:
    """Raise ``ConfigError``: where the plugin failed (a syntax error's line, else the last
    line of the plugin's own file in the traceback, else the last line run) and the error."""
    if isinstance(err, SyntaxError):
        where = f"{err.filename}:{err.lineno}"
        what = f"SyntaxError: {err.msg}"
    else:
        frames = [f for f in traceback.extract_tb(err.__traceback__)
                  if not f.filename.startswith("<frozen importlib")]
        own = [f for f in frames if origin is not None and
               os.path.realpath(f.filename) == os.path.realpath(origin)]
        frame = (own or frames)[-1]
        where = f"{frame.filename}:{frame.lineno}"
        what = f"{type(err).__name__}: {err}".strip()
    raise ConfigError(f"--plugin {plugin}: importing it failed at {where}: {what}") from err
