# The dual-pods controller and the launcher populator (one image; the chart passes the subcommand).
# Build from the repository root: docker build -f images/controller.Dockerfile -t dualpods/controller .
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml requirements.lock README.md ./
COPY api api
COPY controller controller
RUN pip install --no-cache-dir -c requirements.lock . \
 && useradd --uid 65532 --no-create-home controller
USER 65532
# The same command the loopback kubelet runs for this image (e2e/kubelet/images.yaml).
ENTRYPOINT ["python", "-m", "controller"]
