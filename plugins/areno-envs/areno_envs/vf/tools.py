"""A task's verifiers tool servers, run in this process for one episode.

verifiers serves each ``vf.Toolset`` (the task's ``Task.toolsets`` and the taskset's
``Taskset.toolsets``) as an MCP server in a subprocess or a container and lets its harness
program call it over HTTP. Here each toolset registers its ``@vf.tool`` methods on an
in-memory MCP server of the ``mcp`` package (``Toolset.register``, as verifiers does), so the
schemas and the calls are the ones MCP would serve, without a process or a port. Tool names
follow verifiers' chat loop: ``<server>_<tool>``, or the bare tool name for a toolset whose
``TOOL_PREFIX`` is None.

Not carried over: a toolset's per-episode ``vf.State`` (verifiers syncs it through a state
channel; here each call sees a fresh state), and toolsets placed in another runtime (their
``url`` or ``runtime`` settings are ignored: every toolset runs here).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import attrs


@attrs.define
class ToolBox:
    """The tools of one episode: OpenAI tool schemas and a way to call them."""

    schemas: list[dict[str, Any]]
    _dispatch: dict[str, tuple[Any, str]]

    async def call(self, name: str, arguments: str | None) -> str | list[dict[str, Any]]:
        """The tool result the model sees, as verifiers' chat loop words bad calls."""
        from verifiers.v1.harnesses.utils.mcp import mcp_content_to_chat_content  # verifiers'

        try:
            args = json.loads(arguments or "{}")
        except json.JSONDecodeError as exc:
            return f"error: invalid JSON in tool arguments ({exc}); resend the call with valid JSON"
        if not isinstance(args, dict):
            return f"error: tool arguments must be a JSON object, got {type(args).__name__}"
        if name not in self._dispatch:
            return f"error: unknown tool {name!r}"
        server, raw = self._dispatch[name]
        try:
            result = await server.call_tool(raw, args)
        except Exception as exc:  # a failing tool is the model's problem to see, as in MCP
            return f"error: {type(exc).__name__}: {exc}"
        return mcp_content_to_chat_content(result.content)


async def open_tools(task: Any, taskset_cls: type, taskset_config: Any) -> ToolBox:
    """Set up ``task``'s toolsets (``setup`` then ``setup_task``) and list their tools."""
    from mcp.server.mcpserver import MCPServer  # a dependency of verifiers

    toolsets = [*taskset_cls.toolsets(taskset_config), *type(task).toolsets(task.config)]
    schemas: list[dict[str, Any]] = []
    dispatch: dict[str, tuple[Any, str]] = {}
    for toolset in toolsets:
        await toolset.setup()
        await toolset.setup_task(task)
        server = MCPServer(toolset.server_name or type(toolset).__name__)
        toolset.register(server)
        prefix = toolset.server_name
        for tool in await server.list_tools():
            full = f"{prefix}_{tool.name}" if prefix else tool.name
            if full in dispatch:
                raise ValueError(f"two verifiers tools are both named {full!r}")
            schemas.append(
                {
                    "type": "function",
                    "function": {
                        "name": full,
                        "description": tool.description or "",
                        "parameters": tool.input_schema,
                    },
                }
            )
            dispatch[full] = (server, tool.name)
    return ToolBox(schemas=schemas, dispatch=dispatch)


def tool_message(call_id: str, name: str, content: Any) -> Mapping[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "name": name, "content": content}
