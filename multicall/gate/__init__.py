"""The node readiness gate (docs/node-readiness.md): the startup taint comes off, and the
`LinkerdCNIReady` condition turns true, only when this node can program a pod end to end.

    run.py       `Gate`: the rounds beside install-cni's watch, the taint and condition
                 writes (optimistic concurrency), the uninstall's cleanup
    checks.py    the plugin file, the chain read back, the API, the agent's ACCEPT
    selftest.py  ADD/CHECK/DEL of the installed plugin in a scratch netns (leaves nothing)

What is pure (the patches, the condition, the verdict, the environment) is
`multicall.core.node_gate`'s. Layer: a service; the install-cni applet wires it in.
"""
