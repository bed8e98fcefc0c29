# specbatch on NVIDIA's Triton 24.10 image with the PyTorch and Python backends
# (the same server version the nvidia-pytriton wheel carries).
# It runs as the image's unprivileged triton-server user. `specbatch serve` binds every
# interface (--host 0.0.0.0: the container's network is the boundary) and restricts
# Triton's administrative APIs to callers sending the header specbatch-admin-key with
# the value of SPECBATCH_ADMIN_KEY (unset: a random key, so they stay closed).
FROM nvcr.io/nvidia/tritonserver:24.10-pyt-python-py3

# The GPU fast path (torch.compile, CUDA graphs, FlexAttention; scripts/bench_gpu.py) is
# written against torch 2.13.0, the version the project pins everywhere; the image's own
# torch is older, so the CUDA 12.6 build of 2.13.0 replaces it (24.10 ships CUDA 12.6).
ARG TORCH_VERSION=2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu126

ENV PIP_NO_CACHE_DIR=1 \
    HF_HOME=/home/triton-server/.cache/huggingface \
    SPECBATCH_CACHE=/home/triton-server/.cache/specbatch

WORKDIR /opt/specbatch
COPY pyproject.toml README.md ./
COPY specbatch ./specbatch
COPY client ./client
COPY model_repository ./model_repository
COPY ensemble ./ensemble
COPY scripts ./scripts

# Torch first, pinned, from its CUDA index; then the other dependencies and the package without deps.
RUN pip install "torch==${TORCH_VERSION}" --index-url "${TORCH_INDEX}" \
 && pip install "transformers>=4.51" "safetensors>=0.4" "tokenizers>=0.21" "tritonclient[all]>=2.50" \
        "aiohttp>=3.9" numpy tqdm pyyaml \
 && pip install --no-deps . \
 && chown -R triton-server:triton-server /opt/specbatch

USER triton-server
# 9000: the OpenAI-compatible front, run as a second container of this image:
#   python3 -m specbatch.openai --grpc-url localhost:8001 --host 0.0.0.0 --port 9000
EXPOSE 8000 8001 8002 9000
HEALTHCHECK --interval=30s --timeout=5s --start-period=600s --retries=3 \
    CMD python3 -c "import urllib.request; urllib.request.urlopen('http://localhost:8000/v2/health/ready', timeout=4)"

CMD ["specbatch", "serve", "--host", "0.0.0.0", "--no-openai"]
