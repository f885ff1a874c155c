# Tollgate's image, for a machine with a container engine:
#   docker build --build-arg VERSION=0.1.0 -t ghcr.io/tollgate-dev/tollgate:0.1.0 .
# `make image` builds the same image without one (tools/image, an
# oci-archive in bin/), named and versioned from the chart.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=dev
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /tollgate ./cmd/tollgate

# Static binary, no shell: distroless's static image as its nonroot user.
FROM gcr.io/distroless/static-debian12:nonroot
ARG VERSION=dev
COPY --from=build /tollgate /tollgate
USER 65532:65532
# 8081 gRPC (RLS, ext_authz, ALS, ext_proc, health); 8080 admin: /healthz
# (liveness) and /readyz (readiness) for the kubelet's HTTP probes, as
# the chart sets them, and /metrics.
EXPOSE 8081 8080
# There is no shell or curl: `tollgate health` GETs /readyz on the admin
# port (TOLLGATE_ADMIN_ADDR moves it with serve's) and exits 0 or 1.
# Docker runs it; Kubernetes ignores it for the chart's probes.
# tools/image writes the same into the image's config (its test checks).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 CMD ["/tollgate", "health"]
LABEL org.opencontainers.image.source="https://github.com/tollgate-dev/tollgate" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.title="tollgate"
ENTRYPOINT ["/tollgate"]
CMD ["serve"]
