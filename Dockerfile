# syntax=docker/dockerfile:1
# Build:  docker build -t stampede .
# Run it with its Postgres and Redis: see docker-compose.yml.

FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
# sqlx query macros must not need a live database inside the image build.
ENV SQLX_OFFLINE=true
# Cache mounts keep the crate registry and target/ between builds; the binaries are
# copied out in the same step because the cached target/ is not in the layer.
# `stampede-load` is the load generator, which `stampede load` runs from beside
# `stampede`.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins \
 && cp target/release/stampede target/release/stampede-load /usr/local/bin/

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /app --shell /usr/sbin/nologin stampede
WORKDIR /app
# Templates, migrations and Lua scripts are compiled into the binary; only the
# static files are served from disk.
COPY --from=build /usr/local/bin/stampede /usr/local/bin/stampede-load /usr/local/bin/
COPY static/ /app/static/
USER stampede
# Inside a container the server must listen on all interfaces to be reachable.
ENV STAMPEDE_LISTEN=0.0.0.0:8080
EXPOSE 8080
CMD ["stampede", "serve"]
