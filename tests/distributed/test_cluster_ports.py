"""The local Ray cluster's ports: each handed out once (a port picked twice, the dashboard's and the metrics
exporter's, once stopped a node from starting: "port ... used by other components")."""

from __future__ import annotations

import socket

from streamfit.distributed._cluster import _free_ports


def test_free_ports_are_distinct_free_and_outside_what_is_taken_or_reserved():
    taken = {12345}
    ports = _free_ports(50, taken, range(61000, 61100))
    assert len(set(ports)) == 50 and 12345 not in ports
    assert not any(61000 <= p < 61100 for p in ports)
    assert taken == {12345, *ports}  # recorded, so a later call for the same cluster skips them
    more = _free_ports(20, taken)
    assert not set(more) & set(ports)
    with socket.socket() as s:  # free: they can be bound
        s.bind(("127.0.0.1", ports[0]))
