"""`make images`: the OCI images of every component, built with buildah from the project's wheel (see
docs/install.md). `python3 -m scripts.images --help` lists what it does."""
