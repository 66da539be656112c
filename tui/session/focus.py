"""The focused head: the one the per-head tabs show, the cursor's move waiting for its
debounce (a held key in the tree must not ask the engine for every head on the way), the
head asked for on the command line, and ``[``/``]`` across layers. No Textual here: the
explorer runs the debounce timer and asks this object what to focus when it fires.
"""

from __future__ import annotations

Head = tuple[int, int]


class HeadFocus:
    """The focused head and the highlighted one waiting to become it."""

    def __init__(self, initial: Head | None = None) -> None:
        self.initial = initial  # focused once the model is open (checked against its shape)
        self.head: Head | None = None
        self.pending: Head | None = None  # highlighted in the tree, debounce running
        # The tree's cursor is on the embedding, the unembedding or an MLP: the focus line
        # describes that node (its kind) instead of the head.
        self.other: str | None = None

    @property
    def waiting(self) -> bool:
        """A cursor move in the tree waits for its debounce before the head is focused."""
        return self.pending is not None and self.pending != self.head

    def due(self) -> Head | None:
        """The head to focus when the debounce runs out (``None``: nothing to do)."""
        return self.pending if self.waiting else None

    def first(self, n_layers: int, n_heads: int) -> tuple[Head, str | None]:
        """The head focused first: ``initial`` if the model has it, else L0.H0 and why."""
        if self.initial is None:
            return (0, 0), None
        layer, head = self.initial
        if 0 <= layer < n_layers and 0 <= head < n_heads:
            return (layer, head), None
        return (0, 0), (f"no head L{layer}.H{head} (the model has {n_layers} layers × "
                        f"{n_heads} heads); showing L0.H0")

    @property
    def target(self) -> Head | None:
        """The head the focus is on its way to: the one waiting for its debounce, else the
        focused one."""
        return self.pending if self.waiting else self.head

    def stepped(self, step: int, n_layers: int, n_heads: int) -> Head:
        """The head ``step`` heads on from the target, across layers, cyclically (from none:
        the first head). From the target, not the focused head: ``] ] [`` pressed faster
        than the debounce must end one head on, not step three times from the same head."""
        heads = [(layer, h) for layer in range(n_layers) for h in range(n_heads)]
        start = self.target
        i = heads.index(start) if start in heads else -step
        return heads[(i + step) % len(heads)]
