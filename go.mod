module github.com/kvgate/kvgate

go 1.26.0

require github.com/NVIDIA/go-nvml v0.13.4-1

require go.yaml.in/yaml/v3 v3.0.6 // indirect
