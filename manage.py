#!/usr/bin/env python
"""Django's command-line utility for Toolkeeper."""
import os
import sys
from pathlib import Path


def main():
    root = Path(__file__).resolve().parent
    # platform/ is a source root, not a package (docs/architecture.md).
    sys.path.insert(0, str(root / "platform"))
    sys.path.insert(0, str(root))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "toolkeeper.settings")
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
