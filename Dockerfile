# syntax=docker/dockerfile:1
#
# onceprint's container image: the broker (`serve`) on SQLite, its database on a volume.
#
#   docker build -t onceprint .
#   docker run -d --name onceprint -p 8080:8080 -v onceprint-data:/var/lib/onceprint onceprint
#   docker logs onceprint      # the admin token, printed once at the first start
#
# docs/DEPLOYMENT.md ("Packages") has the details; packaging/verify-dockerfile.sh runs this
# file's RUN steps in debootstrap chroots where no Docker engine is at hand.

# The toolchain the project is built and tested with (and packaging/verify-dockerfile.sh
# used). The workspace's rust-version is 1.88, what locked dependencies declare (time
# 0.3.55, encoding_rs and the icu crates).
ARG RUST_VERSION=1.95

# ---- builder: compiles the release binary (profile `dist`: stripped, no debug info) ----
# The rust slim images carry gcc and libc6-dev, which the C parts of the build need
# (SQLite, mimalloc, ring). Crates come from the crate registry here, at build time only.
FROM rust:${RUST_VERSION}-slim-bookworm AS builder
WORKDIR /src
COPY . .
# The cache mounts keep downloaded crates and compiled dependencies between builds; the
# binary is copied out of the target directory because a cache mount is not in the layer.
RUN --mount=type=cache,target=/usr/local/cargo/registry --mount=type=cache,target=/src/target \
    cargo build --locked --profile dist -p onceprint \
    && install -D -m 0755 target/dist/onceprint /out/onceprint

# ---- runtime: Debian slim, the binary and nothing else ----
# The binary links only glibc and libgcc_s, which every Debian has (TLS is rustls with its
# roots compiled in, SQLite and the time zones are compiled in), so no packages are
# installed and nothing is fetched when the image runs.
FROM debian:bookworm-slim AS runtime
# A fixed, unprivileged uid, so that volume permissions are predictable and orchestrators
# that insist on a non-root user (runAsNonRoot) accept the image. Above the system range on
# purpose, so that it is unlikely to be a user of the host; --no-log-init keeps the login records
# (sparse files sized by the uid) out of the layer.
RUN groupadd --gid 10001 onceprint \
    && useradd --uid 10001 --gid 10001 --home-dir /var/lib/onceprint --no-create-home --no-log-init \
       --shell /usr/sbin/nologin onceprint \
    && mkdir -p /var/lib/onceprint \
    && chown 10001:10001 /var/lib/onceprint \
    && chmod 0750 /var/lib/onceprint
COPY --from=builder /out/onceprint /usr/local/bin/onceprint
# Settings as environment variables rather than flags, so that `docker run IMAGE backup …`
# or `reconcile …` find the same database; flags given to `serve` still win.
# Inside a container the broker must listen on every interface to be reachable at all.
ENV ONCEPRINT_LISTEN=0.0.0.0:8080 \
    ONCEPRINT_DATABASE_URL=sqlite:///var/lib/onceprint/onceprint.db
USER 10001:10001
WORKDIR /var/lib/onceprint
# The SQLite database with its WAL lives here; it must outlive the container.
VOLUME ["/var/lib/onceprint"]
EXPOSE 8080
# /readyz answers 200 while the broker can reach its database. `onceprint probe` is the
# binary's own HTTP GET, because the slim image has no curl.
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["onceprint", "probe", "--timeout-ms", "3000", "http://127.0.0.1:8080/readyz"]
ENTRYPOINT ["onceprint"]
CMD ["serve"]
