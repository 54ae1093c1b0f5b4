from . import calculator, environment, python_tool  # noqa: F401  (importing them registers the built-ins)
from .environment import Environment, Episode, ToolCall, ToolEnvironment, ToolSettings
from .registry import ToolError, available_tools, get_environment, get_tool, register_environment, register_tool

__all__ = [
    "Environment",
    "Episode",
    "ToolCall",
    "ToolEnvironment",
    "ToolError",
    "ToolSettings",
    "available_tools",
    "get_environment",
    "get_tool",
    "register_environment",
    "register_tool",
]
