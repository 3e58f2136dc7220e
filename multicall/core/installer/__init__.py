"""What `install-cni` derives from its environment, and the CNI config patcher."""
