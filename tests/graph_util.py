"""Helpers for GPU tests that look inside captured graphs."""

from __future__ import annotations


def graph_edges(graph):
    """``[(from kernel name, to kernel name, CUgraphEdgeData)]`` of a captured graph."""
    from cuda.bindings import driver

    from driverlevel._errors import check

    def name(node):
        params = check("cuGraphKernelNodeGetParams", driver.cuGraphKernelNodeGetParams(node))
        n = check("cuFuncGetName", driver.cuFuncGetName(params.func))
        return n.decode() if isinstance(n, bytes) else str(n)

    with graph.device.activated():
        err, _, _, _, count = driver.cuGraphGetEdges(graph.handle, 0)
        check("cuGraphGetEdges", (err,))
        err, frm, to, data, count = driver.cuGraphGetEdges(graph.handle, count)
        check("cuGraphGetEdges", (err,))
        return [(name(frm[i]), name(to[i]), data[i]) for i in range(count)]
