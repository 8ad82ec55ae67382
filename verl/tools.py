"""What a task plugs into the agent loop (``verl.agent``), by name: action formats and tools.

An action format (``verl.agent.format.ActionFormat``) is one class registered with ``register_format(name)``; the
config key ``actor_rollout_ref.rollout.multi_turn.format`` takes the registered names (null: the recipe module's
``DEFAULT_FORMAT``). A format whose policy calls tools (``uses_tools``) shows the run's tools in its prompts.

A tool is one class: a subclass of ``Tool`` with an ``async call(arguments) -> str`` (the text the policy reads),
registered under its class name with ``register_tool``. Which tools a run offers, with which JSON schema and
settings, is the tool config (``actor_rollout_ref.rollout.multi_turn.tool_config_path``), in verl's shape::

    tools:
      - class_name: SearchTool            # a registered class name, or module.Class (imported, then looked up)
        config: {}                        # the tool's own settings, given to its constructor
        tool_schema:                      # what the chat template shows the policy (OpenAI function format)
          type: function
          function: {name: search, description: ..., parameters: {type: object, properties: ..., required: ...}}

Choices:
- The schema is the contract with the policy: arguments are checked against ``function.parameters`` with
  ``jsonschema`` before ``call`` runs (``argument_problem``), so a tool receives only arguments of the declared types;
  a call that does not fit gets an error message the policy reads instead of running.
- A tool may answer many calls at once (``call_many``, default: its calls concurrently); a search tool, for example,
  sends all of a turn's queries in one request.
- ``setup(env)`` hands a tool what the task's loop shares with its tools (for example a retrieval service); a user
  tool that needs nothing ignores it.
- Like the other registries (``verl.algorithms.registry``), a class registered by any module imported before the
  config is checked (a recipe, a plug-in, a test) is as valid as the built-ins. This module imports no config (the
  config's allowed formats are read from here) and no torch.
"""

from __future__ import annotations

import asyncio
import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from verl.algorithms.registry import Registry
from verl.errors import ConfigError

TOOL_CONFIG_KEY = "actor_rollout_ref.rollout.multi_turn.tool_config_path"


class Tool:
    """One tool: its schema (``{"type": "function", "function": {name, description, parameters}}``) and ``call``."""

    def __init__(self, config: dict[str, Any], schema: dict[str, Any]) -> None:
        self.config = config
        self.schema = schema

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    def setup(self, env: Any) -> None:
        """Receive what the loop shares with its tools (``env``, the recipe's); nothing by default."""

    async def call(self, arguments: dict[str, Any]) -> str:
        """The result of one call whose ``arguments`` fit the schema, as the text the policy reads. Raise
        ``ToolCallError`` for a call the tool refuses (the message is shown to the policy)."""
        raise NotImplementedError

    async def call_many(self, arguments: list[dict[str, Any]]) -> list[str | ToolCallError]:
        """One result (or refusal) per call; the calls run concurrently unless a tool batches them itself."""
        results = await asyncio.gather(*(self.call(a) for a in arguments), return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, ToolCallError):
                raise result
        return list(results)


class ToolCallError(Exception):
    """A call a tool refuses (an unknown document id, a division by zero): its message is the tool's answer."""


TOOLS: Registry[type[Tool]] = Registry("tool class")

# Action formats (``verl.agent.format.ActionFormat`` subclasses) by the name ``multi_turn.format`` takes.
ACTION_FORMATS: Registry[type] = Registry("action format")
FORMAT_KEY = "actor_rollout_ref.rollout.multi_turn.format"


def register_format(name: str):
    """Class decorator: register an ``ActionFormat`` subclass as the config value ``multi_turn.format=name``."""
    def register(cls: type) -> type:
        ACTION_FORMATS.add(name, cls)
        return cls
    return register


def format_names() -> tuple[str, ...]:
    """The registered action formats (the allowed values of ``multi_turn.format``)."""
    return ACTION_FORMATS.names()


def default_format(recipe: str) -> str | None:
    """What ``multi_turn.format: null`` means: the ``DEFAULT_FORMAT`` of the recipe module ``recipe`` (imported
    already when a config is loaded); None for a recipe without one (no agent loop). ``load_config`` writes it into
    the loaded config, so a run directory records the format that ran."""
    return getattr(importlib.import_module(recipe), "DEFAULT_FORMAT", None)


def action_format(cfg: Any) -> type | None:
    """The action format class a run uses (``cfg``: a ``verl.config.Config``): ``multi_turn.format``, or when null
    ``default_format``; None when both are unset (a recipe without the agent loop)."""
    name = cfg.actor_rollout_ref.rollout.multi_turn.format
    if name is None:
        name = default_format(cfg.recipe)
        if name is None:
            return None
    if name not in ACTION_FORMATS:
        raise ConfigError(f"config key {FORMAT_KEY}={name!r} is invalid: allowed {', '.join(format_names())} (the "
                          "registered action formats)")
    return ACTION_FORMATS.get(name)


def register_tool(cls: type[Tool]) -> type[Tool]:
    """Class decorator: register ``cls`` under its class name (the tool config's ``class_name``)."""
    if not (isinstance(cls, type) and issubclass(cls, Tool)):
        raise TypeError(f"register_tool takes a subclass of verl.tools.Tool, got {cls!r}")
    TOOLS.add(cls.__name__, cls)
    return cls


@dataclass(frozen=True)
class ToolSpec:
    """One entry of the tool config."""

    class_name: str
    config: dict[str, Any]
    schema: dict[str, Any]  # {"type": "function", "function": {...}}

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]


def _schema_problem(schema: Any) -> str | None:
    """Why ``schema`` is not an OpenAI-style function schema with an object ``parameters`` schema; None if it is."""
    if not isinstance(schema, dict) or schema.get("type") != "function" or not isinstance(schema.get("function"),
                                                                                           dict):
        return "tool_schema must be {type: function, function: {name, description, parameters}}"
    function = schema["function"]
    if not isinstance(function.get("name"), str) or not function["name"].strip():
        return "tool_schema.function.name must be a non-empty string"
    parameters = function.get("parameters")
    if not isinstance(parameters, dict) or parameters.get("type") != "object":
        return "tool_schema.function.parameters must be a JSON schema of type object"
    try:
        jsonschema.Draft202012Validator.check_schema(parameters)
    except jsonschema.SchemaError as err:
        return f"tool_schema.function.parameters is not a valid JSON schema: {err.message}"
    return None


def parse_tool_config(data: Any, where: str) -> list[ToolSpec]:
    """The entries of a tool config (the YAML's content); ConfigError naming ``where``, the entry and the fix."""
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list) or not data["tools"]:
        raise ConfigError(f"{where}: a tool config is a mapping with a non-empty list 'tools' of {{class_name, config, "
                          "tool_schema}} entries (see configs/tools/)")
    specs = []
    for i, entry in enumerate(data["tools"]):
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
            raise ConfigError(f"{where}: tools[{i}] needs a class_name (a registered tool class: "
                              f"{', '.join(TOOLS.names()) or 'none yet'}; or module.Class)")
        problem = _schema_problem(entry.get("tool_schema"))
        if problem:
            raise ConfigError(f"{where}: tools[{i}] ({entry['class_name']}): {problem}")
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ConfigError(f"{where}: tools[{i}].config must be a mapping, got {config!r}")
        specs.append(ToolSpec(entry["class_name"], config, entry["tool_schema"]))
    names = [s.name for s in specs]
    doubled = sorted({n for n in names if names.count(n) > 1})
    if doubled:
        raise ConfigError(f"{where}: tool names must be distinct; {doubled} declared more than once")
    return specs


def read_tool_config(path: str | Path) -> list[ToolSpec]:
    """The tool config at ``path`` (YAML); ConfigError naming the key and the file when it is missing or malformed."""
    where = f"config key {TOOL_CONFIG_KEY}={str(path)!r}"
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as err:
        raise ConfigError(f"{where}: cannot read the file ({err.strerror})") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{where}: not valid YAML ({err})") from None
    return parse_tool_config(data, where)


def tool_class(class_name: str) -> type[Tool]:
    """The class ``class_name`` names: a registered name, or ``module.Class`` (the module is imported first, which
    registers what it defines)."""
    if class_name not in TOOLS and "." in class_name:
        module, _, name = class_name.rpartition(".")
        try:
            loaded = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:
            raise ConfigError(f"tool class_name {class_name!r} cannot be imported ({err})") from None
        if not (isinstance(loaded, type) and issubclass(loaded, Tool)):
            raise ConfigError(f"tool class_name {class_name!r} is not a subclass of verl.tools.Tool")
        return loaded
    if class_name not in TOOLS:
        raise ConfigError(f"unknown tool class_name {class_name!r}: registered are {', '.join(TOOLS.names())} "
                          "(register a class with @verl.tools.register_tool, or give module.Class)")
    return TOOLS.get(class_name)


def build_tools(specs: list[ToolSpec], env: Any) -> dict[str, Tool]:
    """Tool name -> the tool object of each spec, set up with ``env``."""
    tools = {}
    for spec in specs:
        tool = tool_class(spec.class_name)(dict(spec.config), spec.schema)
        tool.setup(env)
        tools[spec.name] = tool
    return tools


def argument_problem(schema: dict[str, Any], arguments: Any) -> str | None:
    """Why ``arguments`` do not fit the tool's ``function.parameters`` schema (the first error, naming the argument
    and what is allowed); None when they do."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    validator = jsonschema.Draft202012Validator(schema["function"]["parameters"])
    error = jsonschema.exceptions.best_match(validator.iter_errors(arguments))
    if error is None:
        return None
    where = ".".join(str(p) for p in error.absolute_path)
    return f"argument {where!r}: {error.message}" if where else error.message


def run_tool_specs(cfg: Any) -> list[ToolSpec] | None:
    """The tools a run offers (``cfg``: a ``verl.config.Config``): None when its action format calls no tools (or
    the recipe has no format); the tool config's, or the recipe module's ``DEFAULT_TOOLS`` when ``tool_config_path``
    is null. Each class is looked up now, so a wrong ``class_name`` fails before any worker starts."""
    chosen = action_format(cfg)
    if chosen is None or not chosen.uses_tools:
        return None
    multi = cfg.actor_rollout_ref.rollout.multi_turn
    if multi.tool_config_path is not None:
        specs = read_tool_config(multi.tool_config_path)
    else:
        specs = getattr(importlib.import_module(cfg.recipe), "DEFAULT_TOOLS", None)
        if specs is None:
            raise ConfigError(f"config key {TOOL_CONFIG_KEY} is null and the recipe {cfg.recipe!r} declares no "
                              "DEFAULT_TOOLS: name a tool config (see configs/tools/)")
    for spec in specs:
        tool_class(spec.class_name)
    return list(specs)
