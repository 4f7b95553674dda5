# syntax=docker/dockerfile:1
# keypool's container image: a build stage with the pinned Rust toolchain, then a small
# runtime (distroless glibc, no shell, no package manager) running as a non-root user.
#
#   docker build --build-arg KEYPOOL_GIT_COMMIT=$(git rev-parse --short=12 HEAD) -t keypool .
#   (add --build-arg PGO=0 for the plain release build, without the PGO training)
#
# The image holds `keypool` and `keypool-sim` (the simulated upstream the compose file
# uses for a first request without a real provider). The configuration is mounted at
# /etc/keypool/keypool.toml; listen on 0.0.0.0:8080 (clients) and 0.0.0.0:9090
# (server.admin_listen: admin API and /metrics), as deploy/ does. The health check is
# the binary's own probe (`keypool probe`: GET /readyz, on the admin listener when the
# config has one). Not built on the project's machines (no container engine runs
# there): see docs/OPERATIONS.md for what was and was not run.

ARG RUST_VERSION=1.95

FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
# git is absent here and .git is not copied (.dockerignore): the commit comes in as an
# argument; keypool's build.rs falls back to "unknown" without it.
ARG KEYPOOL_GIT_COMMIT=unknown
ENV KEYPOOL_GIT_COMMIT=${KEYPOOL_GIT_COMMIT}
# PGO=1 (the default): keypool built with profile-guided optimisation by `cargo xtask
# pgo`, which trains an instrumented build on loopback against keypool-sim inside this
# stage (a minute or two; about 15 % less CPU per request, docs/BENCHMARKS.md). It needs
# the toolchain's llvm-tools and `kill` (procps). PGO=0: the plain release build.
ARG PGO=1
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p keypool --bin keypool \
    && cargo build --release --locked -p keypool-sim --bin keypool-sim \
    && if [ "$PGO" = 1 ]; then \
         apt-get update && apt-get install -y --no-install-recommends procps \
         && rustup component add llvm-tools \
         && cargo xtask pgo --out /tmp/keypool; \
       else cp target/release/keypool /tmp/keypool; fi \
    && install -D -m 0755 /tmp/keypool /out/keypool \
    && install -D -m 0755 target/release/keypool-sim /out/keypool-sim

FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
COPY --from=build /out/keypool /usr/local/bin/keypool
COPY --from=build /out/keypool-sim /usr/local/bin/keypool-sim
COPY --chown=65532:65532 deploy/compose/keypool.toml /etc/keypool/keypool.toml
# distroless' nonroot user (65532); deploy/ keeps state in Redis (no state file)
USER 65532:65532
WORKDIR /home/nonroot
EXPOSE 8080 9090
ENV RUST_LOG=info
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/keypool", "probe", "--config", "/etc/keypool/keypool.toml"]
ENTRYPOINT ["/usr/local/bin/keypool", "--log-format", "json"]
CMD ["serve", "--config", "/etc/keypool/keypool.toml"]
