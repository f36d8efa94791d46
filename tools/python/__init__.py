"""Tools written in Python: the @tool decorator and ToolContext, the shapes a model receives, running a
tool in a process of its own, the shipped built-ins and examples, installed plugins and their page."""
