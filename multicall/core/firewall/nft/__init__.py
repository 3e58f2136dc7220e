"""nf_tables netlink messages for iptables rules, encoded the way iptables-nft 1.8.9 does.

The package splits the codec along its layers, bottom up:

    netlink.py   netlink/nfnetlink framing, nf_tables message types and attributes, replies
    expr.py      nf_tables expressions (meta, payload, cmp, ...) <-> their netlink attributes
    xt.py        xt compat payloads: the multiport, owner, comment and REDIRECT structs
    rulespec.py  one rule as iptables sees it: canonical save tokens <-> `RuleSpec`
    rule.py      `RuleSpec` <-> expressions (iptables-nft's encoder and its decoder)
    dump.py      chain and rule dumps -> the canonical `Table` iptables-nft-save prints
    batch.py     a `TableChange` -> one NFNL batch (create, flush, append)

Rules of the package:
1. Pure: bytes and values in, bytes and values out. The socket lives in
   `multicall.effects.firewall.nft`.
2. A rule goes three ways: canonical `iptables-save` tokens <-> `RuleSpec` <-> expressions
   <-> netlink attributes. Each step is a function pair and each pair round-trips, so
   `dump(apply(x)) == x` holds by construction and is tested against the real
   `iptables-nft-save`.
3. The encoding copies iptables-nft (xtables-compat), learned by tracing its sendmsg:
   interfaces, protocol, addresses and tcp/udp ports are native `meta`/`payload`/`cmp`/
   `bitwise`/`range` expressions on register 1; multiport, owner and comment are `match`
   expressions carrying the xt structs; REDIRECT is a `target` expression; verdicts are
   `immediate`; a `counter` sits before the verdict; the rule carries NFTA_RULE_COMPAT.
4. Decoding is strict: an expression or option outside what is listed here raises
   `FirewallError` naming it. A rule we cannot print exactly is never printed wrongly.
5. Integers inside nf_tables attributes are big-endian; xt structs are host-endian
   (little-endian on every platform cnibox ships for), as the kernel reads them.
6. Values are `NamedTuple`s, not frozen dataclasses: the package defines about thirty of them
   and a frozen dataclass costs milliseconds of import time each. They are immutable and
   slotted all the same; equality is by value, so tests that care compare types too.
"""
