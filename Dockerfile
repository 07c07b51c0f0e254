# syntax=docker/dockerfile:1
# kthrottle container image: a Kafka-protocol throttling proxy.
#
#   docker build -t kthrottle:0.1.0 .
#   docker run --rm -v "$PWD/deploy:/etc/kthrottle:ro" -p 9092:9092 -p 9100-9102:9100-9102 \
#       -p 9644:9644 kthrottle:0.1.0
#
# The config is mounted at /etc/kthrottle/kthrottle.yaml (quotas_file, if any, beside it),
# certificates under /etc/kthrottle/tls. SIGTERM drains (drain_seconds), then the process exits.
#
# The default image is the proxy's runtime only. Capture to files (Parquet, pyarrow: about 170 MB)
# is an extra:  --build-arg KTHROTTLE_EXTRAS=capture
#
# Behind a TLS-inspecting proxy or with a private package index (BuildKit, or buildah/podman):
#   --secret id=pip_ca,src=corporate-ca.pem    a CA bundle pip trusts (PIP_CERT)
#   --secret id=pip_conf,src=pip.conf          a pip config, e.g. an index URL with credentials
#   --build-arg PIP_INDEX_URL=https://pypi.example/simple   (and PIP_EXTRA_INDEX_URL): URLs without
#       credentials only, since build arguments stay in the builder stage's history
# Secrets are mounted for the RUN steps that need them and never stored in a layer; the final
# stage has no pip configuration at all.

ARG PYTHON_VERSION=3.11.14
ARG DEBIAN_RELEASE=bookworm

# ---- builder: the full Python image (its C compiler builds the compiled hot path) -------------
FROM python:${PYTHON_VERSION}-${DEBIAN_RELEASE} AS builder
ARG PIP_VERSION=25.3
ARG SETUPTOOLS_VERSION=80.9.0
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG KTHROTTLE_EXTRAS=""
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# pip_env: the CA bundle and pip config, when given as secrets (see the header).
RUN printf '%s\n' \
        '[ -f /run/secrets/pip_ca ] && export PIP_CERT=/run/secrets/pip_ca' \
        '[ -f /run/secrets/pip_conf ] && export PIP_CONFIG_FILE=/run/secrets/pip_conf' \
        'true' > /usr/local/bin/pip_env
RUN --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_conf \
    . /usr/local/bin/pip_env \
    && python -m venv /opt/kthrottle \
    && /opt/kthrottle/bin/pip install "pip==${PIP_VERSION}" \
    && python -m pip install "pip==${PIP_VERSION}" "setuptools==${SETUPTOOLS_VERSION}"
COPY pyproject.toml README.md ./
COPY protocol ./protocol
COPY quota ./quota
COPY proxy ./proxy
COPY analytics ./analytics
# A wheel of the project, then the project and its runtime dependencies (uvloop among them) into
# the venv that the final stage copies; pip byte-compiles, so the read-only image never writes .pyc.
RUN --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_conf \
    . /usr/local/bin/pip_env \
    && python -m pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
    && wheel=$(echo /wheels/kthrottle-*.whl) \
    && /opt/kthrottle/bin/pip install "${wheel}${KTHROTTLE_EXTRAS:+[${KTHROTTLE_EXTRAS}]}" \
    && /opt/kthrottle/bin/python -c "import uvloop, proxy.cli"
# The compiled hot path (protocol/compiled.py): mypyc builds it here, in a build-only venv with
# the project's dependencies (mypy reads their types), next to the installed packages, where
# protocol/compiled.py looks for it. Nothing of mypy or the compiler reaches the final stage.
ARG MYPY_VERSION=2.4.1
COPY dev/compile.py ./dev/compile.py
RUN --mount=type=secret,id=pip_ca --mount=type=secret,id=pip_conf \
    . /usr/local/bin/pip_env \
    && python -m venv /opt/build \
    && /opt/build/bin/pip install "pip==${PIP_VERSION}" "setuptools==${SETUPTOOLS_VERSION}" \
        "mypy==${MYPY_VERSION}" /wheels/kthrottle-*.whl \
    && /opt/build/bin/python dev/compile.py --require \
    && site=$(/opt/kthrottle/bin/python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") \
    && cp -r .compiled "$site/.compiled" \
    && /opt/kthrottle/bin/python -P -c "import protocol.frames as f, quota.manager as m; assert f.__file__.endswith('.so') and m.__file__.endswith('.so'), (f.__file__, m.__file__)" \
    && /opt/kthrottle/bin/pip uninstall -y pip

# ---- final: slim Python, the venv, a non-root user; no compilers, no build tools ---------------
FROM python:${PYTHON_VERSION}-slim-${DEBIAN_RELEASE}
ARG KTHROTTLE_UID=10001
ARG KTHROTTLE_GID=10001
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="kthrottle" \
      org.opencontainers.image.description="Kafka-protocol throttling proxy with Kafka's own quota semantics" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN groupadd --system --gid "${KTHROTTLE_GID}" kthrottle \
    && useradd --system --uid "${KTHROTTLE_UID}" --gid "${KTHROTTLE_GID}" --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin kthrottle \
    && mkdir -p /etc/kthrottle/tls /var/lib/kthrottle/capture \
    && chown -R "${KTHROTTLE_UID}:${KTHROTTLE_GID}" /var/lib/kthrottle
COPY --from=builder /opt/kthrottle /opt/kthrottle
ENV PATH=/opt/kthrottle/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    KTHROTTLE_ADMIN_PORT=9644
WORKDIR /var/lib/kthrottle
USER ${KTHROTTLE_UID}:${KTHROTTLE_GID}
# 9092: gateway bootstrap (or the sidecar listener); 9100-9199: gateway broker ports
# (broker_port_base 9100 + node id); 9644: admin HTTP (/metrics, /healthz, /readyz).
EXPOSE 9092 9100-9199 9644
# Needs admin.host to include loopback (0.0.0.0 or 127.0.0.1); KTHROTTLE_ADMIN_PORT = admin.port.
HEALTHCHECK --interval=15s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('KTHROTTLE_ADMIN_PORT', '9644'), timeout=4)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["kthrottle"]
CMD ["run", "--config", "/etc/kthrottle/kthrottle.yaml"]
