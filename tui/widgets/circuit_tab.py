"""The Circuit tab's loads: ``CircuitPane`` (tui/widgets/edge_circuit.py) with the engine calls
that fill it. Its inputs follow the Patch tab's (tui/session/patch.py): the user's prompts and
tokens when typed, else the built-in first-occurrence task (its corrupt run redraws the first
copy, so the induction circuit's K-composition carries the answer: the tab finds a circuit
without typing). One ``EdgesRequest`` (EAP-IG by default, ``m`` switches to EAP) with its top
edges verified, then the faithfulness of the current N, then the curve; ``CircuitTopChanged``
asks for the new N's faithfulness (the explorer, tui/screens/explorer.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from textual.binding import Binding, BindingType

from headscope.engine.core.errors import HeadscopeError, PromptError
from headscope.engine.core.requests import (
    CompositionRequest,
    EdgesRequest,
    FaithfulnessRequest,
    TokenizeRequest,
)
from headscope.tui.widgets.edge_circuit import CircuitPane

if TYPE_CHECKING:
    from headscope.tui.base.messages import CircuitEdgeChosen
    from headscope.tui.base.protocols import LoadKey, PaneHost

VERIFY = 5  # the top edges patched exactly beside their estimates
DEFAULT_TASK = "first-occurrence"


class CircuitTab(CircuitPane):
    """``CircuitPane`` loading its circuit from the engine (see the module's docstring)."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("m", "switch_method", "EAP/EAP-IG", id="circuit-method",
                tooltip="Circuit tab: switch between EAP-IG (default) and EAP"),
    ]

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.method = "eap-ig"
        self.inputs: dict[str, Any] = {}  # the request's inputs, as last loaded
        self.fraction: float | None = None

    def action_switch_method(self) -> None:
        self.method = "eap" if self.method == "eap-ig" else "eap-ig"
        screen: Any = self.screen
        if hasattr(screen, "_load_active"):
            screen._load_active()

    def _progress(self, fraction: float) -> None:
        self.fraction = float(fraction)  # read by the pane's timer

    async def _inputs(self, host: PaneHost, patch: dict[str, Any]) -> dict[str, Any]:
        """The Patch tab's inputs as a request's: ids, not text."""
        if patch.get("task") is not None or (patch.get("clean") is None and patch.get("corrupt") is None):
            return {"task": DEFAULT_TASK if patch.get("task") in (None, "induction") else patch["task"]}
        engine = host.engine
        out: dict[str, Any] = {}
        for name in ("clean", "corrupt"):
            given = patch[name]
            ids = given if isinstance(given, list) else await engine.get(TokenizeRequest.of(host.structure, given))
            out[name] = [list(ids)]
        for name in ("answer", "wrong"):
            text = (patch.get(name) or "").strip()
            digits = text[1:] if text.startswith("#") else text
            if digits.isdigit():
                out[name] = int(digits)
                continue
            ids = await engine.get(TokenizeRequest.of(host.structure, text or " "))
            if len(ids) != 1:
                raise PromptError(None, f"the {name} token {text!r} is {len(ids)} tokens: give one, as the Patch tab")
            out[name] = int(ids[0])
        return out

    async def load(self, host: PaneHost, key: LoadKey) -> None:
        """Attribute every edge for the Patch tab's inputs, verify the top few, then the
        faithfulness of N and the curve."""
        engine = host.engine
        screen: Any = host
        patch = screen.patch_request() if hasattr(screen, "patch_request") else {}
        self.computing(f"{self.method} edge attribution", 0.0)
        self.fraction = 0.0

        what = f"{self.method} edge attribution"
        timer = self.set_interval(0.25, lambda: self.computing(what, self.fraction))
        try:
            inputs = await self._inputs(host, patch)
            self.inputs = {**inputs, "method": self.method}
            attribution = await engine.get(EdgesRequest.of(host.structure, **self.inputs, verify=VERIFY),
                                           self._progress)
        except HeadscopeError as err:
            self.failed(getattr(err, "reason", None) or str(err))
            return
        except Exception as err:  # an engine bug: said here, and reported by the explorer
            self.failed(f"unexpected error {err!r}")
            raise
        finally:
            timer.stop()
        if not host.fresh(key):
            return
        self.show(attribution.scores, exact=attribution.exact)
        host.keep_result("circuit", {"method": self.method, "edges": [
            {"edge": attribution.scores.graph.edges[int(i)], "score": float(attribution.scores.scores[int(i)])}
            for i in attribution.scores.ranked()[:50]]})
        if self.state != "result":
            return
        await self.faithfulness(host, self.top, curve=True)

    async def faithfulness(self, host: PaneHost, top: int, *, curve: bool = False) -> None:
        """The faithfulness of the top-``top`` circuit (and the curve) into the pane."""
        if not self.inputs or self.scores is None or top < 1:
            return
        engine = host.engine
        self.computing(f"faithfulness of the top {top}")
        try:
            # with a progress callback: the engine's status line then ends with the job
            found = await engine.get(FaithfulnessRequest.of(host.structure, **self.inputs, tops=(top,), curve=curve),
                                     self._progress)
        except HeadscopeError as err:
            self._set_status(f"faithfulness: {getattr(err, 'reason', None) or err}")
            return
        if found.curve is not None:
            self.set_curve(found.curve, redraw=False)
        self.add_faithfulness(found.points)

    async def composition_of(self, host: PaneHost, msg: CircuitEdgeChosen) -> None:
        """The chosen edge's weight-based composition score beside its estimate and exact
        value (the hypothesis of the weights beside the causal evidence), and in a toast."""
        assert msg.source is not None and msg.target is not None and msg.input is not None
        try:
            comp = await host.engine.get(CompositionRequest.of(host.structure, msg.input), lambda _: None)
        except HeadscopeError as err:
            host.report(str(err))
            return
        (l1, h1), (l2, h2) = msg.source, msg.target
        score = float(comp.scores[l1, h1, l2, h2])
        weights = f"{msg.input.upper()}-composition {score:.3f} (baseline {comp.baseline:.3f})"
        lines = self.status.split("\n")
        if len(lines) > 1 and lines[1].startswith(f"{msg.edge}:"):  # beside its estimate and exact
            lines[1] = f"{lines[1].split(' · enter')[0]} · {weights}"
        else:
            lines = [lines[0], f"{msg.edge}: {weights}"]
        self._set_status("\n".join(lines))
        self.app.notify(f"{msg.edge}: {weights}", timeout=6)
