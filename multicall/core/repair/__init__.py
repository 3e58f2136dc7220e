"""The repair controller's pure parts: which pods to delete, its CLI, and the sandbox lookup."""
