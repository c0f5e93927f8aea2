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


def kernel_node_carveouts(graph):
    """``{kernel name: preferred shared-memory carveout}`` of a captured graph's kernel nodes (the
    launch attribute ``CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT`` each node recorded)."""
    from cuda.bindings import driver

    from driverlevel._errors import check

    attr = driver.CUkernelNodeAttrID.CU_LAUNCH_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    out = {}
    with graph.device.activated():
        err, _, count = driver.cuGraphGetNodes(graph.handle, 0)
        check("cuGraphGetNodes", (err,))
        err, nodes, count = driver.cuGraphGetNodes(graph.handle, count)
        check("cuGraphGetNodes", (err,))
        for node in nodes[:count]:
            kind = check("cuGraphNodeGetType", driver.cuGraphNodeGetType(node))
            if kind != driver.CUgraphNodeType.CU_GRAPH_NODE_TYPE_KERNEL:
                continue
            params = check("cuGraphKernelNodeGetParams", driver.cuGraphKernelNodeGetParams(node))
            name = check("cuFuncGetName", driver.cuFuncGetName(params.func))
            value = check("cuGraphKernelNodeGetAttribute", driver.cuGraphKernelNodeGetAttribute(node, attr))
            out[name.decode() if isinstance(name, bytes) else str(name)] = int(value.sharedMemCarveout)
    return out
