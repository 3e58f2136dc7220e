"""The firewall engine and its two kernel backends (x_tables via libiptc, nf_tables)."""
