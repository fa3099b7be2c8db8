"""Developer scripts: generators of committed files, and the lock file writer."""
