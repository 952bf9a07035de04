# kvgate: multi-stage build.
#
# go-nvml needs cgo (it dlopens libnvidia-ml at run time), so the binary is
# linked against glibc and the runtime image must have glibc: distroless
# base, not static. No NVIDIA library is baked in: with the NVIDIA container
# runtime (--gpus all, or the device plugin on Kubernetes) the driver's
# libnvidia-ml.so.1 is mounted into the container and kvgate reads GPU memory
# through it; without it kvgate starts normally and uses the configured sizes.

FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=1 CGO_CFLAGS="-O2 -g -Wno-deprecated-declarations" \
    go build -trimpath -ldflags="-s -w" -o /out/kvgate ./cmd/kvgate

FROM gcr.io/distroless/base-debian12:nonroot
COPY --from=build /out/kvgate /usr/local/bin/kvgate
# The examples become /etc/kvgate, and the container's own config (listens
# on 0.0.0.0, takes its backend from KVGATE_BACKEND_URL) is its kvgate.yaml,
# next to the model config it names.
COPY examples /etc/kvgate
COPY examples/kvgate-container.yaml /etc/kvgate/kvgate.yaml
# Ask the NVIDIA runtime for NVML only (utility), not CUDA: kvgate reads
# memory figures and never runs kernels.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# distroless:nonroot is uid 65532; numeric, so that runtimes enforcing
# runAsNonRoot can verify it without reading /etc/passwd.
USER 65532:65532
EXPOSE 8080
# No shell and no curl in the image: the binary checks itself. Exec form,
# since there is no /bin/sh to run the shell form.
HEALTHCHECK --interval=10s --timeout=5s --start-period=10s --retries=3 \
    CMD ["/usr/local/bin/kvgate", "health", "--url", "http://127.0.0.1:8080/readyz", "--timeout", "4s"]
ENTRYPOINT ["/usr/local/bin/kvgate"]
# Set KVGATE_BACKEND_URL, or mount your own config over
# /etc/kvgate/kvgate.yaml (its relative paths resolve next to it).
# `serve --listen 0.0.0.0:8080` alone runs the demo.
CMD ["serve", "--config", "/etc/kvgate/kvgate.yaml"]
