# autotune for Kubernetes (deploy/kubernetes/) and any container runtime with NVIDIA GPUs.
# The install steps are the ones CI runs (.ci/run -> make): torch pinned first, then autotune with the
# versions of constraints.txt. On PyPI, torch==2.13.0 for Linux x86-64 is the CUDA build (its CUDA
# libraries come as pip packages; the driver comes from the node); CI installs the same version's CPU wheel.
#   docker build -t REGISTRY/autotune:0.1.0 . && docker push REGISTRY/autotune:0.1.0
FROM python:3.12-slim-bookworm

ARG TORCH=torch==2.13.0
ARG EXTRAS=postgres,s3,eval

WORKDIR /opt/autotune
COPY pyproject.toml constraints.txt README.md ./
COPY autotune ./autotune
RUN python -m pip install --no-cache-dir --upgrade pip \
    && python -m pip install --no-cache-dir "$TORCH" \
    && python -m pip install --no-cache-dir ".[$EXTRAS]" -c constraints.txt
COPY deploy/nightly.sh /usr/local/bin/autotune-nightly

# Models, reference outputs and trial files; mount a volume here to keep them between runs.
ENV AUTOTUNE_CACHE_DIR=/cache HF_HOME=/cache/huggingface
WORKDIR /work
ENTRYPOINT ["autotune"]
