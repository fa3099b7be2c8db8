"""dualpods: launcher."""
