# The GPU cluster image: Ray 2.60 with CUDA, and tkg with its `gpu` extra (vLLM, ray[llm],
# FlagEmbedding) installed from the lock, the same export the Makefile installs from:
#   docker build -f configs/cluster.Dockerfile -t tkg-gpu .
# Model folders are not in the image: mount them (or COPY them) where configs/cluster.yaml
# points, nothing is downloaded at run time.
FROM rayproject/ray:2.60.0-py311-gpu
ARG UV_VERSION=0.13.9
WORKDIR /opt/tkg
COPY pyproject.toml uv.lock README.md ./
COPY tkg tkg
COPY pipeline pipeline
COPY query query
COPY jobs jobs
COPY configs configs
RUN pip install --no-cache-dir uv==${UV_VERSION} \
 && uv export --locked --no-hashes --no-emit-project --quiet --extra gpu -o /tmp/constraints-gpu.txt \
 && pip install --no-cache-dir -c /tmp/constraints-gpu.txt '.[gpu]'
