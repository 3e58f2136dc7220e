"""The CNI protocol as containernetworking/cni v1.3.0 speaks it, and linkerd-cni's config."""
