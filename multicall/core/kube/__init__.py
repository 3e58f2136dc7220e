"""The Kubernetes objects and kubeconfig the plugin reads, and Linkerd's per-pod policy."""
