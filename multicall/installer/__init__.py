"""The DaemonSet installer (`install-cni`): install, watch, undo (docs/install-cni.md).

    run.py       `run(Options, env, Logger) -> exit status`: --once, watch, --uninstall; the
                 pid file; the undo when a signal ends the watch
    install.py   `Installer`: the binary and its links, the kubeconfig, the config patches,
                 the undo journal written ahead of each change; `install`, their order
    state.py     what one run wrote (`State`), converted to and from the undo journal
    undo.py      putting the node back: every step goes on after a failure, all reported
    watch.py     the inotify loop, and signals recorded only (`Stop`)

What is pure (the environment, the conflist patcher, the journal's format) is
`multicall.core.installer`'s. Layer: a service, above `multicall.plugin`, below the applets.
"""
