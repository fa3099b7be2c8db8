"""The wire contract of dualpods: request/response bodies, watch events and metadata keys.

Everything a user or another component can observe lives here as pydantic models or named
constants, so the launcher, the controllers and the tests agree on one definition.
"""
