"""Pointing a TorchScript trace at another device or float dtype than it was traced with.

A trace keeps the devices and dtypes it ran with as constants: `torch.arange(n, device=x.device)`,
transformers' `mask.to(torch.float32)`. The export step traces on the CPU in fp32; `map_location` and
`.half()` move parameters only, so on a GPU or in fp16 those constants would leave tensors on the CPU or
in fp32 ("expected scalar type Float but found Half"), and masks filled with fp32's lowest value would
overflow fp16. Both rewrites act on every method's graph and must
run before the methods first run (when TorchScript compiles their graphs).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

# TorchScript's integer codes of torch's dtypes (c10::ScalarType)
_SCALAR_TYPE = {torch.float32: 6, torch.float16: 5, torch.bfloat16: 15}


def _graphs(module: torch.jit.ScriptModule) -> Iterator[torch.Graph]:
    for sub in module.modules():
        for name in sub._c._method_names():
            yield sub._c._get_method(name).graph


def point_at_device(module: torch.jit.ScriptModule, device: str) -> int:
    """Every CPU device constant becomes `device`; returns how many there were."""
    target, changed = str(torch.device(device)), 0
    for graph in _graphs(module):
        for node in graph.findAllNodes("prim::Constant"):
            if node.output().type().kind() == "DeviceObjType" and node.s("value") == "cpu":
                node.s_("value", target)
                changed += 1
    return changed


def point_at_dtype(module: torch.jit.ScriptModule, source: torch.dtype, target: torch.dtype) -> int:
    """Every constant `source` passed as an operator's `dtype` argument becomes `target`, and `source`'s
    smallest and largest values (the masks' "minus infinity", torch.finfo(dtype).min) become `target`'s,
    which would not fit it otherwise; returns how many constants changed. A dtype argument gets a new
    constant: the old one may also be an ordinary integer elsewhere in the graph."""
    extremes = {torch.finfo(source).min: torch.finfo(target).min, torch.finfo(source).max: torch.finfo(target).max}
    changed = 0
    for graph in _graphs(module):
        for node in graph.findAllNodes("prim::Constant"):
            if node.output().type().kind() == "FloatType" and node.f("value") in extremes:
                node.f_("value", extremes[node.f("value")])
                changed += 1
        for node in graph.nodes():
            schema = node.schema()
            if schema == "(no schema)":
                continue
            for index, (argument, value) in enumerate(
                zip(torch._C.parse_schema(schema).arguments, node.inputs(), strict=False)
            ):
                if (
                    argument.name == "dtype"
                    and value.node().kind() == "prim::Constant"
                    and value.type().kind() == "IntType"
                    and value.toIValue() == _SCALAR_TYPE[source]
                ):
                    with graph.insert_point_guard(node):
                        node.replaceInput(index, graph.insertConstant(_SCALAR_TYPE[target]))
                    changed += 1
    return changed


def point_graph_at_dtype(module: torch.fx.GraphModule, source: torch.dtype, target: torch.dtype) -> int:
    """The same for an exported program's graph module (`ExportedProgram.module()`): every `source` dtype an
    operator is given, `source`'s extremes among its arguments, and every `source` tensor constant the graph
    reads (lifted plain tensor attributes, which `.to(dtype)` leaves alone: one left in fp32 promotes what it
    touches back to fp32) become `target`'s; returns how many."""
    extremes = {torch.finfo(source).min: torch.finfo(target).min, torch.finfo(source).max: torch.finfo(target).max}

    def swap(value: object) -> object:
        if value is source:
            return target
        if isinstance(value, float) and value in extremes:
            return extremes[value]
        return value

    changed = 0
    for graph_module in module.modules():
        if not isinstance(graph_module, torch.fx.GraphModule):
            continue
        for node in graph_module.graph.nodes:
            if node.op == "get_attr":
                changed += _point_constant_at_dtype(graph_module, node.target, source, target)
            if node.op != "call_function":
                continue
            args, kwargs = tuple(swap(a) for a in node.args), {k: swap(v) for k, v in node.kwargs.items()}
            if args != node.args or kwargs != node.kwargs:
                node.args, node.kwargs = args, kwargs
                changed += 1
        graph_module.recompile()
    return changed


def _point_constant_at_dtype(module: torch.nn.Module, qualified: str, source: torch.dtype, target: torch.dtype) -> int:
    owner_name, _, name = qualified.rpartition(".")
    owner = module.get_submodule(owner_name) if owner_name else module
    value = getattr(owner, name)
    if not isinstance(value, torch.Tensor) or isinstance(value, torch.nn.Parameter) or value.dtype != source:
        return 0
    if name in owner._buffers:  # a buffer follows .to(dtype) on its own
        return 0
    setattr(owner, name, value.to(target))
    return 1
