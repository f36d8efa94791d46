"""People's own accounts at upstream servers (docs/accounts.md): OAuth to them, the token vault, the pages."""
