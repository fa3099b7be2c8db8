pytest_plugins = ["e2e.fixtures", "e2e.failure_logs"]
