# specbatch on NVIDIA's Triton 24.10 image with the PyTorch and Python backends
# (the same server version the nvidia-pytriton wheel carries; torch is preinstalled).
# It runs as the image's unprivileged triton-server user. `specbatch serve` binds every
# interface (--host 0.0.0.0: the container's network is the boundary) and restricts
# Triton's administrative APIs to callers sending the header specbatch-admin-key with
# the value of SPECBATCH_ADMIN_KEY (unset: a random key, so they stay closed).
FROM nvcr.io/nvidia/tritonserver:24.10-pyt-python-py3

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

# The image's torch stays: install the other dependencies, then the package without deps.
RUN pip install "transformers>=4.51" "safetensors>=0.4" "tokenizers>=0.21" "tritonclient[all]>=2.50" \
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
