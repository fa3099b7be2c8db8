"""dualpods: e2e."""
