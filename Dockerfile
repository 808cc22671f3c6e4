# Recall's container image: recall-coordinator, recall-worker and recall in /opt/recall/bin.
#
#   GPU (default): builds on a CUDA devel image, runs on the CUDA runtime image
#     docker build -t recall:0.1.0 .
#   CPU variant: the same stages on Debian 12
#     docker build -t recall:0.1.0-cpu \
#       --build-arg BUILD_IMAGE=debian:12 --build-arg RUNTIME_IMAGE=debian:12-slim .
#
# Nothing is downloaded but the base images and distribution packages: the build stage
# installs tools/install_deps.sh's package list, the runtime stage the packages that own
# the libraries the binaries link (found with ldd and dpkg -S in the build stage).
# helm/README.md deploys the image with the chart in helm/recall.

# CUDA 13, as the project is built and tested with (cuBLAS 12.9 or later is needed for the
# block-scaled FP8 GEMM, docs/gpu.md; with an older one that path is compiled out).
ARG BUILD_IMAGE=nvidia/cuda:13.0.0-devel-ubuntu24.04
ARG RUNTIME_IMAGE=nvidia/cuda:13.0.0-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
ENV DEBIAN_FRONTEND=noninteractive
WORKDIR /src
COPY tools/install_deps.sh tools/install_deps.sh
RUN bash tools/install_deps.sh && rm -rf /var/lib/apt/lists/*
COPY . .
# Portable code (AVX2/FMA rather than -march=native); no tests or benchmarks.
RUN cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DRECALL_NATIVE=OFF \
      -DRECALL_BUILD_TESTS=OFF -DRECALL_BUILD_BENCH=OFF \
    && cmake --build build --target recall-worker recall-coordinator recall recall_sentencepiece
# The project's install rules (packaging/CMakeLists.txt), runtime component: bin/ and the
# lib/librecall_sentencepiece.so recall-worker loads from ../lib beside its binary.
RUN cmake --install build --prefix /opt/recall --component runtime
# The runtime packages: whatever owns a library the binaries load (CUDA's own libraries are
# in the runtime image already).
RUN set -eu; \
    for f in /opt/recall/bin/* /opt/recall/lib/*.so; do ldd "$f"; done \
      | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' | sort -u > /tmp/libs; \
    while read -r lib; do \
      case "$lib" in /usr/local/cuda*) continue ;; esac; \
      dpkg -S "$lib" 2>/dev/null || dpkg -S "$(readlink -f "$lib")" 2>/dev/null \
        || dpkg -S "/usr$lib" 2>/dev/null || echo "unowned: $lib" >&2; \
    done < /tmp/libs | grep -v '^diversion' | cut -d: -f1 | sort -u > /opt/recall/runtime-packages.txt; \
    cat /opt/recall/runtime-packages.txt

FROM ${RUNTIME_IMAGE}
ENV DEBIAN_FRONTEND=noninteractive
COPY --from=build /opt/recall /opt/recall
RUN apt-get update \
    && xargs -a /opt/recall/runtime-packages.txt apt-get install -y --no-install-recommends \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 recall \
    && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home recall
ENV PATH=/opt/recall/bin:$PATH
USER 10001:10001
WORKDIR /tmp
EXPOSE 50050 50051 9090 9464
CMD ["recall", "--help"]
