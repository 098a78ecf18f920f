# syntax=docker/dockerfile:1
# Build:  docker build -t tollgate .
# Run:    docker run -p 8080:8080 -v "$PWD/gateway.toml:/etc/tollgate/gateway.toml:ro" tollgate
# Reload: docker kill -s HUP <container>   (the entrypoint is exec form, so
#         SIGHUP and SIGTERM reach tollgate itself, not a shell)
# A mounted gateway.toml must listen on 0.0.0.0 to be reachable from outside.

FROM rust:1-slim-bookworm AS build
WORKDIR /src
COPY . .
# The `dist` profile: the slowest build for the fastest binary (every crate
# in one codegen unit before fat LTO; Cargo.toml says what it measured). The
# slim image's gcc builds mimalloc, the binary's allocator.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    cargo build --profile dist --locked --bin tollgate \
 && cp target/dist/tollgate /tollgate \
 && sed -e 's/^listen = "127.0.0.1:8080"/listen = "0.0.0.0:8080"/' \
        -e 's/^admin = "127.0.0.1:9091"/admin = "0.0.0.0:9091"/' \
        gateway.toml > /gateway.toml

FROM debian:bookworm-slim
RUN useradd --system --uid 10001 --no-create-home tollgate
COPY --from=build /tollgate /usr/local/bin/tollgate
COPY --from=build /gateway.toml /etc/tollgate/gateway.toml
# Replace the configuration by mounting a file or directory here.
VOLUME ["/etc/tollgate"]
USER tollgate
EXPOSE 8080 9091
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/tollgate"]
CMD ["run", "--config", "/etc/tollgate/gateway.toml"]
