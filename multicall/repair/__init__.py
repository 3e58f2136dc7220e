"""The repair controller (`linkerd-cni-repair-controller`) and repair in place
(docs/repair-controller.md)."""
