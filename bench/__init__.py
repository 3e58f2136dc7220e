"""`make bench` (bench/bench.py) in modules: paths, measure (rows), spawn (processes),
netns, upstream (the replay), plugin_runs (cnibox's side), agent_rows, cri_rows, report."""
