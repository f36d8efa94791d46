"""Signing in: local passwords and single sign-on with an OpenID provider (docs/identity.md)."""
