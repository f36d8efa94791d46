"""The source of tools written in Python with `@tool` (shipped built-ins included)."""
from tools.catalog.registry import register_source
from tools.python.decorators import ToolError, python_tool, python_tools


class PythonSource:
    kinds = ("python", "builtin")

    def definitions(self, tenant):
        return [spec.definition() for spec in python_tools().values()]

    def invoke(self, tool, arguments, ctx):
        spec = python_tool(tool.name)
        if spec is None:
            raise ToolError(f"the code of {tool.name} is not installed on this server", error_type="ToolUnavailable")
        return spec(arguments, ctx)


register_source(PythonSource())
