"""The node agent (`linkerd-cni-agent`): serves the plugin from a warm process (docs/agent.md)."""
