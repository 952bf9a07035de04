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
RUN CGO_ENABLED=1 go build -trimpath -ldflags="-s -w" -o /out/kvgate ./cmd/kvgate

FROM gcr.io/distroless/base-debian12:nonroot
COPY --from=build /out/kvgate /usr/local/bin/kvgate
# The examples become /etc/kvgate: kvgate.yaml next to the model configs it names.
COPY examples /etc/kvgate
# Ask the NVIDIA runtime for NVML only (utility), not CUDA: kvgate reads
# memory figures and never runs kernels.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/kvgate"]
# Mount your own config over /etc/kvgate/kvgate.yaml (its relative paths
# resolve next to it). `serve --listen 0.0.0.0:8080` alone runs the demo.
CMD ["serve", "--config", "/etc/kvgate/kvgate.yaml", "--listen", "0.0.0.0:8080"]
