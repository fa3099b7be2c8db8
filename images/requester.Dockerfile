# The requester of server-requesting Pods: GPU discovery (NVML), FMA's SPI, the readiness probe.
# Build from the repository root: docker build -f images/requester.Dockerfile -t dualpods/requester .
# It needs NVML (libnvidia-ml) from the NVIDIA container runtime, which mounts it when the Pod has GPUs.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml requirements.lock README.md ./
COPY api api
COPY requester requester
RUN pip install --no-cache-dir -c requirements.lock . \
 && useradd --uid 65532 --no-create-home requester
USER 65532
ENTRYPOINT ["python", "-m", "requester"]
