# Order Ledger: `ledger serve` in a small Debian image.
#
#   docker build -t order-ledger .
#   docker run --rm -p 8080:8080 \
#     -e LEDGER_DATABASE_URL='postgres://ledger:secret@db.example:5432/ledger?sslmode=require' order-ledger
#
# docker-compose.yml runs it next to PostgreSQL; docs/operations.md ("Running with Docker") has the
# details. The image has no PostgreSQL programs, so LEDGER_DATABASE_URL is required (the private
# cluster and `ledger demo` need initdb/pg_ctl and are not for this image; nor are the benchmarks).

# The default is the toolchain the project is developed and tested with. 6.2 is the oldest the
# dependencies accept: Package.swift says tools 6.1, but hummingbird 2.28.1 (its minimum) and
# swift-log, swift-metrics, swift-prometheus, async-http-client at the resolved versions declare
# swift-tools-version 6.2.
ARG SWIFT_VERSION=6.3

# ---------------------------------------------------------------------------------------------
FROM swift:${SWIFT_VERSION}-bookworm AS build
WORKDIR /build

# Dependencies first, so this layer stays cached while only the sources change. Package.resolved
# is git-ignored; when the build context has one, its versions are used as they are.
COPY Package.* ./
RUN swift package resolve $([ -f Package.resolved ] && echo --force-resolved-versions)

# Sources, the SQL migrations (the LedgerSchema target embeds them in the binary with
# `.embedInCode`, so no resource bundle has to travel with it) and Tests/ (the manifest names
# the test targets; SwiftPM wants their folders to exist even when building only `ledger`).
COPY . .

# --static-swift-stdlib links the Swift runtime and Foundation (with its ICU data) into the
# binary. The ledger does not use FoundationNetworking or FoundationXML (Apple's verifyReceipt is
# called through AsyncHTTPClient), so neither libcurl nor libxml2 is needed at run time.
RUN swift build -c release --product ledger --static-swift-stdlib \
 && mkdir -p /staging \
 && cp "$(swift build -c release --show-bin-path)/ledger" /staging/ \
 && if ls "$(swift build -c release --show-bin-path)"/*.resources > /dev/null 2>&1; then \
      cp -R "$(swift build -c release --show-bin-path)"/*.resources /staging/; fi \
 && if [ -x /usr/libexec/swift/linux/swift-backtrace-static ]; then \
      cp /usr/libexec/swift/linux/swift-backtrace-static /staging/; fi

# ---------------------------------------------------------------------------------------------
FROM debian:bookworm-slim

# ca-certificates: TLS to Apple (verifyReceipt) and to PostgreSQL with sslmode=prefer/require
# (the system trust store is the only one used). tzdata: time zones for Foundation.
# libstdc++6 and zlib1g: the two shared libraries a --static-swift-stdlib binary still links.
RUN export DEBIAN_FRONTEND=noninteractive \
 && apt-get update -q \
 && apt-get install -y -q --no-install-recommends ca-certificates tzdata libstdc++6 zlib1g \
 && rm -rf /var/lib/apt/lists/*

RUN useradd --system --uid 10001 --user-group --home-dir /app --no-create-home --shell /usr/sbin/nologin ledger

# The binary and, next to it, the static crash backtracer (used when SWIFT_BACKTRACE enables it).
COPY --from=build /staging/ /app/
ENV PATH=/app:$PATH \
    SWIFT_BACKTRACE=enable=yes,sanitize=yes,threads=all,cache=no \
    LEDGER_HOST=0.0.0.0 \
    LEDGER_PORT=8080

WORKDIR /app
USER ledger:ledger
EXPOSE 8080

# Ready when /readyz answers 200 (the database answers and every migration is applied). No curl
# in the slim image: bash's /dev/tcp is enough for one GET.
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/${LEDGER_PORT:-8080} && printf 'GET /readyz HTTP/1.1\\r\\nHost: localhost\\r\\nConnection: close\\r\\n\\r\\n' >&3 && head -n 1 <&3 | grep -q ' 200 '"]

# `serve` applies pending migrations before it listens, then serves until SIGTERM (graceful).
ENTRYPOINT ["ledger"]
CMD ["serve"]
