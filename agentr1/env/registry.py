"""Environments and tools by name: what ``env.kind`` and ``env.tools`` in a config select.

Built in: the environment kinds ``qa`` (multi-hop QA over the ``search`` tool, synthetic data
generator included), ``sql`` (the same questions over an SQLite database with the ``sql`` tool,
generator included), ``mixed`` (both tools in one episode), ``tools`` (any registered tools, demonstrations from each record's gold
calls), ``function_call`` (BFCL: each record's own functions, one call judged by BFCL's checker) and
``math_tool`` (word problems with the ``calculate`` tool), and the tools ``search``, ``sql`` and
``calculate``, each declared by its kind's package (``agentr1.env.qa``, ...; the records are
``agentr1.env.kind``'s). A kind may name converters from input formats (``data.sources``,
``agentr1 data convert``): ``agentr1.env.datasets`` makes every dataset through them. A user's module registers more without touching ``agentr1/``::

    from agentr1.env.registry import register_tool

    @register_tool
    def convert(value: float, unit: str) -> str:
        '''Convert a length to metres. ...'''

and a config names it: ``plugins: [my_tools.py]`` (a module name or a ``.py`` file, imported when
the config is resolved, :func:`resolve`), ``env: {kind: tools, tools: [convert]}``. See docs/add-a-tool.md.

A tool is registered as a function (its schema checked at registration: a missing type hint or
docstring fails right there) or, with ``factory=True``, as ``factory(cfg, data_dir) -> callable``
for tools that need the run's data or settings (the search index). An environment is registered
as ``build(cfg, data_dir, tools) -> Environment``, with an optional synthetic data generator
``synth(cfg) -> (splits, corpus)`` (or ``(splits, corpus, {file name: bytes})``, e.g. a
database) used when ``data.dir`` does not exist yet.
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import sys
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from agentr1.env import function_call, math_tool, mixed, qa, sql
from agentr1.env.kind import GOLD_CALLS_RULE, EnvKind, RecordRule, ToolEntry  # noqa: F401 (RecordRule: plug-ins' import)
from agentr1.errors import UserError

log = logging.getLogger("agentr1.plugins")

if TYPE_CHECKING:
    from agentr1.config import Config
    from agentr1.env.base import Environment
    from agentr1.env.tools import Tool


TOOLS_KIND = EnvKind("tools", "agentr1.env.base:build_tool_env", (),
                     description="answer with any registered tools; demonstrations from each record's meta.calls",
                     record_rules=(GOLD_CALLS_RULE,))
"""The framework's own kind: any registered tools, each record's gold calls demonstrated."""

_ENVS: dict[str, EnvKind] = {k.name: k for k in (qa.KIND, sql.KIND, mixed.KIND, TOOLS_KIND, function_call.KIND,
                                                 math_tool.KIND)}
_TOOLS: dict[str, ToolEntry] = {t.name: t for t in (*qa.TOOLS, *sql.TOOLS, *math_tool.TOOLS)}


class RegistryError(UserError, ValueError):
    """An unknown name, or a plug-in that cannot be loaded; the message lists what is known."""


def _resolve(target: Callable | str) -> Callable:
    if callable(target):
        return target
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)


def _replacing(kind: str, name: str, old: Any | None, new: Callable) -> None:
    """Warn when a registration replaces another (a plug-in's tool named ``sql`` takes the built-in's
    place in every run that loads it); registering the same target again is silent."""
    if old is not None and old is not new:
        where = old if isinstance(old, str) else f"{getattr(old, '__module__', '?')}:{getattr(old, '__qualname__', old)}"
        log.warning("%s %r from %s:%s replaces the registered %s %r (%s)", kind, name, new.__module__,
                    getattr(new, "__qualname__", new), kind, name, where)


def register_environment(name: str, build: Callable | None = None, *, tools: tuple[str, ...] | list[str] = (),
                         synth: Callable | None = None, description: str = "",
                         record_rules: tuple[RecordRule, ...] | list[RecordRule] = (GOLD_CALLS_RULE,),
                         converters: dict[str, Callable] | None = None) -> Callable:
    """Make ``env.kind: name`` build ``build(cfg, data_dir, tools) -> Environment`` (``tools``:
    the registered ``tools`` it always has, then the config's ``env.tools``); ``synth(cfg) ->
    (splits, corpus)`` generates its data; ``record_rules`` are what its records must satisfy
    (default: gold calls, what ``ToolEnv``'s demonstrator plays); ``converters`` the input formats
    its data is converted from (``data.sources``). Used as a call, or as a decorator without ``build``."""
    def decorate(target: Callable) -> Callable:
        _replacing("environment", name, _ENVS[name].build if name in _ENVS else None, target)
        _ENVS[name] = EnvKind(name, target, tuple(tools), synth, description or (target.__doc__ or "").strip(),
                              tuple(record_rules), dict(converters or {}))
        return target
    return decorate(build) if build is not None else decorate


def register_tool(fn: Callable | None = None, *, name: str | None = None, factory: bool = False,
                  network: bool = False):
    """Register a tool function (``@register_tool`` or ``@register_tool(name=...)``); with
    ``factory=True`` the function is ``factory(cfg, data_dir)`` returning the tool callable, and
    ``name=`` is required: it is the name the model calls, which the factory's own is not. A tool's
    sandbox refuses sockets unless it is registered with ``network=True``."""
    if factory and not name:
        raise RegistryError("register_tool(factory=True) needs name=...: the model calls the tool by that name "
                            "(the factory's own name would be used otherwise)")

    def decorate(target: Callable) -> Callable:
        from agentr1.env.tools import Tool

        tool_name = name or getattr(target, "__name__", type(target).__name__.lower())
        if not factory:
            tool_name = Tool.from_callable(target, name).name  # schema problems fail at import time
        _replacing("tool", tool_name, _TOOLS[tool_name].make if tool_name in _TOOLS else None, target)
        _TOOLS[tool_name] = ToolEntry(tool_name, target, factory, network)
        return target
    return decorate(fn) if fn is not None else decorate


def environment_kinds() -> list[str]:
    return sorted(_ENVS)


def data_formats() -> dict[str, str]:
    """Every input format a registered kind converts from, with that kind's name."""
    return {fmt: kind.name for kind in _ENVS.values() for fmt in kind.converters}


def converter(fmt: str) -> tuple[str, Callable]:
    """``(kind name, convert)`` of input format ``fmt``; RegistryError listing the known ones."""
    formats = data_formats()
    if fmt not in formats:
        raise RegistryError(f"unknown data format {fmt!r}; known: {', '.join(sorted(formats))} (a plug-in registers "
                            "more: register_environment(converters=...))")
    return formats[fmt], _resolve(_ENVS[formats[fmt]].converters[fmt])


def tool_names() -> list[str]:
    return sorted(_TOOLS)


def env_kind(name: str) -> EnvKind:
    if name not in _ENVS:
        raise RegistryError(f"env.kind: unknown environment {name!r}; registered: {', '.join(environment_kinds())} "
                            "(a plug-in registers more: `plugins` in the config, docs/add-a-tool.md)")
    return _ENVS[name]


def check_tools(names: list[str]) -> None:
    unknown = [n for n in names if n not in _TOOLS]
    if unknown:
        raise RegistryError(f"env.tools: unknown tool {unknown[0]!r}; registered: {', '.join(tool_names())} "
                            "(a plug-in registers more: `plugins` in the config, docs/add-a-tool.md)")


def resolve(cfg: Config) -> Config:
    """``cfg`` once its plug-ins are loaded and ``env.kind`` and ``env.tools`` are checked against
    what is registered (RegistryError naming the key and the known names). Validating a config
    runs no plug-in code; every entry point resolves the config it loaded, and building an
    environment or its data resolves again (idempotent), so no path runs on an unresolved one."""
    load_plugins(cfg.plugins)
    env_kind(cfg.env.kind)
    check_tools(cfg.env.tools)
    return cfg


def load_plugins(specs: list[str]) -> None:
    """Import each plug-in: a module name (``my_pkg.tools``) or a ``.py`` file path (relative to
    the working directory); RegistryError naming the entry when it cannot be imported."""
    for spec in specs:
        try:
            if spec.endswith(".py"):
                path = Path(spec).resolve()
                if not path.is_file():
                    raise FileNotFoundError(f"no such file: {path}")
                module_name = f"agentr1_plugin_{path.stem}"
                if module_name in sys.modules and getattr(sys.modules[module_name], "__file__", None) == str(path):
                    continue
                module_spec = importlib.util.spec_from_file_location(module_name, path)
                module = importlib.util.module_from_spec(module_spec)
                sys.modules[module_name] = module
                module_spec.loader.exec_module(module)
            else:
                importlib.import_module(spec)
        except Exception as err:  # noqa: BLE001 - any failure is the plug-in's; say which
            raise RegistryError(f"plugins: cannot load {spec!r}{_plugin_line(err, spec)}: "
                                f"{type(err).__name__}: {err}") from err


def _plugin_line(err: BaseException, spec: str) -> str:
    """`` (path:line)``: the deepest frame of the traceback that lies in the plug-in's own file
    (or package), where the import failed; empty when none does (e.g. a missing module)."""
    import traceback

    own = str(Path(spec).resolve()) if spec.endswith(".py") else None
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if (own and f.filename == own) or (not own and spec.replace(".", "/") in f.filename)]
    if isinstance(err, SyntaxError) and err.filename and (not own or err.filename == own):
        return f" ({err.filename}:{err.lineno})"
    return f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""


def check_records(kind: str, data_dir: str | Path) -> None:
    """The environment kind's record rules (:class:`RecordRule`, what its Great Expectations suite
    ``env_<kind>`` checks too) on the dataset's raw rows: DataError naming the file, line and
    field of the first row that breaks one (a split that is not there is not checked)."""
    from agentr1.data.records import DataError, iter_json_lines, split_path

    for rule in env_kind(kind).record_rules:
        for split in rule.splits:
            path = split_path(data_dir, split)
            if not path.is_file():
                continue
            for line, row, err in iter_json_lines(path):
                if err is None and isinstance(row, dict) and rule.problems(row):
                    raise DataError(path, line, rule.field, f"env.kind {kind!r} needs: {rule.rule}")


def plugin_files(specs: list[str]) -> list[Path]:
    """The ``.py`` files among ``specs`` (what a logged model must carry to rebuild its tools)."""
    return [Path(s).resolve() for s in specs if s.endswith(".py")]


def build_tools(cfg: Config, data_dir: Path, names: list[str] | tuple[str, ...]) -> list[Tool]:
    from agentr1.env.tools import Tool

    check_tools(list(names))
    data_dir = Path(data_dir).resolve()  # a factory runs again in its sandbox worker, whose cwd is its scratch dir
    if data_dir.is_file():  # a served agent given a corpus file: the resources lie beside it
        data_dir = data_dir.parent
    tools = []
    for n in names:
        entry = _TOOLS[n]
        target = _resolve(entry.make)
        if entry.factory:  # built here for its schema, and again inside its sandbox worker
            tool = Tool.from_callable(target(cfg, data_dir), n, make=partial(target, cfg, data_dir))
        else:
            tool = Tool.from_callable(target, n)
        tools.append(replace(tool, network=entry.network))
    return tools


def build_env(cfg: Config, data_dir: str | Path) -> Environment:
    """The environment ``cfg.env.kind`` over the dataset (or resources) in ``data_dir``, with
    its own tools, ``cfg.env.tools`` and the tools of the MCP servers in ``cfg.env.mcp``."""
    kind = env_kind(resolve(cfg).env.kind)
    names = list(dict.fromkeys([*kind.tools, *cfg.env.tools]))
    tools = build_tools(cfg, Path(data_dir), names)
    if cfg.env.mcp:  # the MCP servers' tools (agentr1.env.mcp): each server starts here
        from agentr1.env.mcp import mcp_tools

        tools += mcp_tools(cfg)
    env = _resolve(kind.build)(cfg, Path(data_dir), tools)
    env.kind = kind.name
    return env


def synth_data(cfg: Config) -> tuple[dict, list] | None:
    """The synthetic dataset of ``cfg.env.kind`` (None when the kind has no generator), checked
    for the shape every generator returns: RegistryError naming the generator and what it gave."""
    kind = env_kind(resolve(cfg).env.kind)
    if kind.synth is None:
        return None
    generator = _resolve(kind.synth)
    out = generator(cfg)
    problem = _generated_problem(out)
    if problem:
        raise RegistryError(f"env.kind {kind.name!r}: its generator {generator.__module__}:{generator.__qualname__} "
                            f"returned {problem}; expected (splits, corpus) or (splits, corpus, files): splits "
                            "{'train': [QARecord, ...], 'dev': [...], 'test': [...]}, corpus [Document, ...], files "
                            "{file name: bytes} (agentr1.data.records; docs/add-a-tool.md)")
    return out


def _generated_problem(out: Any) -> str | None:
    from agentr1.data.records import Document, QARecord

    if not isinstance(out, tuple | list) or len(out) not in (2, 3):
        return f"a {type(out).__name__}" + (f" of {len(out)} items" if isinstance(out, tuple | list) else "")
    splits, corpus, *files = out
    if not isinstance(splits, dict) or not all(isinstance(v, list | tuple) for v in splits.values()):
        return f"splits as a {type(splits).__name__}, not a dict of lists"
    for name, records in splits.items():
        bad = next((r for r in records if not isinstance(r, QARecord)), None)
        if bad is not None:
            return f"a {type(bad).__name__} in split {name!r}, not a QARecord"
    bad = next((d for d in corpus if not isinstance(d, Document)), None) if isinstance(corpus, list | tuple) else corpus
    if bad is not None:
        return f"a {type(bad).__name__} in the corpus, not a Document" if isinstance(corpus, list | tuple) \
            else f"the corpus as a {type(corpus).__name__}, not a list of Document"
    if files and not (isinstance(files[0], dict) and all(isinstance(k, str) and isinstance(v, bytes)
                                                          for k, v in files[0].items())):
        return "files that are not {file name: bytes}"
    return None
