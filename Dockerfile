# The flowsched service image:  docker build -t ghcr.io/flowsched/flowsched:0.1.0 .
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# Only what the package needs (see .dockerignore); tests and benchmark results stay out.
WORKDIR /src
COPY pyproject.toml README.md ./
COPY extender ./extender
COPY scoring ./scoring
COPY benchmarks ./benchmarks
RUN pip install . && rm -rf /src

# A fixed non-root uid/gid, matching runAsUser/fsGroup in deploy/base/flowsched.yaml.
RUN groupadd --system --gid 10001 flowsched \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/flowsched --create-home \
            --shell /usr/sbin/nologin flowsched
USER 10001:10001
WORKDIR /var/lib/flowsched
# The progress store lives on the data volume, not in the (read-only) image filesystem.
ENV FLOWSCHED_PROGRESS_DB=/var/lib/flowsched/progress.sqlite

EXPOSE 8888
ENTRYPOINT ["flowsched"]
CMD ["serve", "--port", "8888"]
