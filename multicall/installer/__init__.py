"""The DaemonSet installer (`install-cni`): install, watch, undo (docs/install-cni.md)."""
