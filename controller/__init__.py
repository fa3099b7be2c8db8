"""dualpods: controller."""
