"""The containerd CRI suite: linkerd-cni run by Debian's containerd 1.6 as a kubelet would have
it run (docs/cri-tests.md). node.py builds the throwaway node, client.py speaks CRI v1,
cluster.py holds what the cases share, modes.py how the plugin runs (direct, later the agent)."""
