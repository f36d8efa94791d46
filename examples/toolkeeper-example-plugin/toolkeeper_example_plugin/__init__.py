"""An example Toolkeeper plugin (see tools.py)."""
