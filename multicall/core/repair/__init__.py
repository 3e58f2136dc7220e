"""The repair controller's pure parts: its command line (as clap parses it), which pods
to repair, and the pod sandbox it repairs in place."""
