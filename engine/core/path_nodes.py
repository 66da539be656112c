"""The ends of a path (path patching, the exact check of an edge): the edge graph's node names
(``core.edge_graph``, docs/math.md "Edge attribution"), parsed and checked against a model's
shape. One vocabulary for ``path-patch``, ``edges --verify`` and the API.

- senders: ``input`` (the token embedding ``W_E[id]`` only), ``a{l}.h{h}`` (the head's output
  as it enters the residual stream), ``m{l}`` (the MLP's output);
- receivers: ``a{l}.h{h}<q|k|v>`` (the head's own copy of its layer's input for its queries,
  keys or values), ``m{l}`` (the MLP's input), ``logits`` (the final stream before the final
  norm).

A head is also written ``L1.H2`` (the other commands' form), its receiving input then given
apart (``path-patch --patch k``). A path's row (``PatchRow.heads``, the request's ``edge``, the
results store's key) keeps each end as a ``(layer, head)`` pair (``node_key``): a head is
itself, so head paths keep the keys they always had; ``m{l}`` is ``(l, -1)``, ``input``
``(-1, -1)``, ``logits`` ``(-2, -1)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from headscope.engine.core.errors import IndexOutOfRangeError, InvalidRequestError

__all__ = ["PathNode", "check_path", "key_name", "key_node", "node_key", "path_node"]

_NAME = re.compile(r"^(?:(input)|[aAlL](\d+)\.[hH](\d+)(?:<([qkv])>)?|m(\d+)|(logits))$")


@dataclass(frozen=True)
class PathNode:
    """One end of a path: ``kind`` ``input``, ``head``, ``mlp`` or ``logits``; ``part`` the
    q, k or v input of a receiving head."""

    kind: str
    layer: int = -1
    head: int = -1
    part: str | None = None

    @property
    def name(self) -> str:
        if self.kind == "head":
            return f"a{self.layer}.h{self.head}" + (f"<{self.part}>" if self.part else "")
        return f"m{self.layer}" if self.kind == "mlp" else self.kind

    def with_part(self, part: str) -> PathNode:
        return PathNode(self.kind, self.layer, self.head, part)


def path_node(name: str, where: str | None = None) -> PathNode:
    """The node named ``name`` (syntax only: ``check_path`` checks it against a model)."""
    found = _NAME.match(str(name).strip())
    if found is None:
        raise InvalidRequestError(where, f"{name!r} is not a node: write input, a0.h1 (L0.H1), a1.h2<k>, m0 or logits")
    inp, layer, head, part, mlp, logits = found.groups()
    if inp:
        return PathNode("input")
    if logits:
        return PathNode("logits")
    if mlp is not None:
        return PathNode("mlp", int(mlp))
    return PathNode("head", int(layer), int(head), part)


def check_path(sender: PathNode, receiver: PathNode, *, n_layers: int, n_heads: int, has_mlp: bool,
               parallel: bool | None = None, where: str | None = None) -> None:
    """Refuse a path the model cannot have: a sender that is not ``input``, a head or an MLP,
    a receiver that is not a head's q/k/v, an MLP or ``logits``, a node outside the model, or
    a sender not written before the receiver reads (into ``m{l}`` layer ``l``'s heads too,
    unless attention and MLP run in parallel; ``parallel=None``: not known yet)."""
    for node in (sender, receiver):
        if node.kind == "head":
            if not 0 <= node.layer < n_layers:
                raise IndexOutOfRangeError(where, f"layer {node.layer} out of range (model has {n_layers} layers: "
                                           f"0..{n_layers - 1})")
            if not 0 <= node.head < n_heads:
                raise IndexOutOfRangeError(where, f"head {node.head} out of range (layer has {n_heads} heads: "
                                           f"0..{n_heads - 1})")
        elif node.kind == "mlp":
            if not has_mlp:
                raise InvalidRequestError(where, f"{node.name}: this model has no MLPs (attention only)")
            if not 0 <= node.layer < n_layers:
                raise IndexOutOfRangeError(where, f"layer {node.layer} out of range (model has {n_layers} layers: "
                                           f"0..{n_layers - 1})")
    if sender.kind == "logits" or sender.part:
        raise InvalidRequestError(where, f"{sender.name} reads the stream, it does not write to it: a path's sender "
                                  "is input, a head or an MLP")
    if receiver.kind == "input" or (receiver.kind == "head" and receiver.part is None):
        raise InvalidRequestError(where, f"{receiver.name} is not a receiver: a head's q, k or v input "
                                  "(a1.h2<k>), an MLP or logits")
    s_layer = -1 if sender.kind == "input" else sender.layer
    r_layer = n_layers if receiver.kind == "logits" else receiver.layer
    same_layer_mlp = sender.kind == "head" and receiver.kind == "mlp" and s_layer == r_layer and parallel is not True
    if s_layer >= r_layer and not same_layer_mlp:
        raise InvalidRequestError(where, f"a path runs from an earlier layer to a later one: {sender.name} is not "
                                  f"below {receiver.name}")


_INPUT, _LOGITS = (-1, -1), (-2, -1)


def node_key(node: PathNode) -> tuple[int, int]:
    """The ``(layer, head)`` pair a path's row keeps for ``node`` (module docstring)."""
    if node.kind == "head":
        return node.layer, node.head
    return {"input": _INPUT, "logits": _LOGITS}.get(node.kind, (node.layer, -1))


def key_node(key: tuple[int, int] | PathNode, part: str | None = None) -> PathNode:
    """The node of a row's pair (``node_key``); a head receiver gets its input ``part``."""
    if isinstance(key, PathNode):
        return key
    layer, head = int(key[0]), int(key[1])
    if head >= 0:
        return PathNode("head", layer, head, part)
    if (layer, head) == _INPUT:
        return PathNode("input")
    if (layer, head) == _LOGITS:
        return PathNode("logits")
    return PathNode("mlp", layer)


def key_name(key: tuple[int, int], part: str | None = None) -> str:
    """The name of a row's pair (``a0.h1``, ``a1.h2<k>`` with ``part``, ``m0``, ``input``, ``logits``)."""
    return key_node(key, part).name
