# fastdata on an NVIDIA GPU: the CUDA build of torch, DALI, Pillow-SIMD with AVX2 (stock Pillow
# gone), Kornia, webdataset and fastdata with its native extension, all but torch installed by
# scripts/install.sh, the README's install, so the two cannot drift.
#   docker build -t fastdata .
#   docker run --rm --gpus all fastdata          # the profiler on a synthetic set it makes
#   docker run --rm --gpus all -v /data:/data fastdata fastdata-profile /data/train --step-ms 100 --tune
FROM nvidia/cuda:12.8.1-runtime-ubuntu22.04

SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV DEBIAN_FRONTEND=noninteractive \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1

# Python 3.11 with its headers and a C/C++ compiler (the extension and Pillow-SIMD are compiled
# here), and the zlib and libjpeg-turbo headers Pillow-SIMD and the native JPEG decoder build on.
# Versions are the base image's release's (pinning each would break at its next security update).
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3.11 python3.11-dev python3.11-venv \
        build-essential zlib1g-dev libjpeg-turbo8-dev \
    && rm -rf /var/lib/apt/lists/*

# A virtualenv first on PATH, so `python3` and `pip` are 3.11's and the system Python is untouched;
# in it the CUDA 12.8 build of torch (its cuDNN and CUDA libraries come as wheels), in a layer
# that a change to fastdata does not rebuild. scripts/install.sh installs torch only when missing.
ENV VIRTUAL_ENV=/opt/venv
ENV PATH=/opt/venv/bin:$PATH
RUN python3.11 -m venv "$VIRTUAL_ENV" \
    && pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128

WORKDIR /opt/fastdata
COPY . .
# --dali: DALI whether or not the build machine has a GPU. FASTDATA_AVX2=1: Pillow-SIMD's AVX2 paths
# whatever the build machine's CPU (the image then needs an AVX2 CPU, as every GPU server has).
RUN FASTDATA_AVX2=1 bash scripts/install.sh --dali

CMD ["fastdata-profile", "synthetic", "--step-ms", "100"]
