"""linkerd-cni's commands, runnable in-process: the seam between the CNI protocol and the
Kubernetes API and firewall it drives.

    run.py         `run_plugin(PluginRequest, PluginDeps) -> PluginResult`: skel's order of
                   checks, the command's handler, and the one boundary that turns errors into
                   CNI error JSON. The `linkerd-cni` applet, the node agent and tests call it.
    commands.py    ADD, CHECK, DEL, STATUS and GC (Istio's doAddRun: the logic, given its ports)
    ports.py       the ports (`Kube`, `PodApi`, `Firewall`), `PluginDeps` and the real adapters
    pod_inputs.py  what ADD and CHECK read from the API for one pod (at most three GETs)
    logrus.py      the plugin's log lines, in upstream's logrus text format

Layer: above `multicall.effects` (the real adapters use it), below `multicall.applets`.
"""
