"""The focus line above the tabs: the focused head and its scores (their z's once the null is
known, the ablation effect once swept), A → B in compare mode, or the embed/unembed/MLP
node's shapes. The richest line that fits is shown, so no number is ever cut."""

from __future__ import annotations

import math
from typing import Any

from rich.text import Text
from textual.widgets import Static

from headscope.engine.core.results import HeadScores, ScoreNull
from headscope.tui.base.labels import (
    ABLATION_LABEL,
    ABLATION_SHORT,
    FILTER_THRESHOLD,
    SCORES,
    SHORT,
    SINKS,
    score,
    z_score,
    z_text,
)

Head = tuple[int, int]
# The focus line on a narrow terminal: no room for dup-tok.
SHORT_LABELS = {"copying_score": "copy", "qk_positivity": "QK+", "prev_token_score": "prev",
                "induction_score": "ind"}


class FocusLine(Static):
    """The richest of the lines it is given that fits its width (chosen again on every
    resize), so no number is ever cut."""

    def show(self, choices: list[Text]) -> None:
        self._choices = choices
        self._fit()

    def _fit(self) -> None:
        choices = getattr(self, "_choices", None) or [Text()]
        room = self.content_size.width
        self.update(next((c for c in choices if not room or c.cell_len <= room), choices[-1]))

    def on_resize(self) -> None:
        self._fit()


def part_text(kind: str, structure: dict[str, Any]) -> str:
    """The line for a node that is not a head: the embedding, the unembedding, an MLP."""
    s = structure
    return {"embed": f"Embed: W_E [{s.get('d_vocab')}, {s.get('d_model')}]"
                     + (f", W_pos [{s.get('n_ctx')}, {s.get('d_model')}]"
                        if s.get("positional") == "learned" else ""),
            "unembed": f"Unembed: W_U [{s.get('d_model')}, {s.get('d_vocab')}]"
                       + (" — tied: W_Eᵀ" if s.get("tied_unembed") else ""),
            "mlp": f"MLP: d_mlp {s.get('d_mlp')}"}.get(kind, "")


def score_texts(row: HeadScores, null: ScoreNull | None, ablation: float) -> list[Text]:
    """The focus line's scores, richest first: each a candidate line (the first that fits
    the line's width is shown). With the null, each score carries its z ("ind +0.95 z=41");
    the sink scores only on a sink head; ``ablation``: the head's effect (NaN: not swept)."""
    sinks = [k for k in SINKS if score(row, k) >= FILTER_THRESHOLD]
    full = [k for k, _ in SCORES if k not in SINKS] + sinks
    lean = [k for k in full if k in SHORT_LABELS or k in sinks]  # no dup-tok
    labels, short = dict(SCORES), {**SHORT, **SHORT_LABELS}
    z = {k: z_text(z_score(null, row, k)) for k in full}
    top = max(full, key=lambda k: z_score(null, row, k)
              if z_score(null, row, k) == z_score(null, row, k) else -math.inf)
    core = [k for k in lean if k not in SINKS]
    few = ["copying_score", "prev_token_score", "induction_score"]
    # Less important parts go first: the weaker scores' z's, then QK+ and the sinks, then the
    # other scores; the z of the head's strongest score goes last but one (at 80 columns the
    # line used to keep QK+ and prev and drop `z=219` from `ind +0.95`).
    plans = [(full, labels, full), (full, short, full), (lean, short, lean), (core, short, core)]
    keys = list(full)
    for dropped in ["duplicate_token_score", *sinks, "qk_positivity", "prev_token_score",
                    "copying_score", "induction_score"]:
        if dropped != top and dropped in keys:
            keys = [k for k in keys if k != dropped]
            plans.append((keys, short, [top]))
    plans.append((few, short, []))
    out = []
    for keys, names, with_z in plans:
        text = Text()
        for i, key in enumerate(keys):
            v = score(row, key)
            if i:
                text.append("· ", style="dim")
            text.append(f"{names[key]} {v:+.2f} " if v == v else f"{names[key]} — ")
            if key in with_z and z[key]:
                text.append(f"{z[key]} ", style="dim")
        if not math.isnan(ablation):
            text.append("· ", style="dim")
            text.append(f"{ABLATION_SHORT if names is short else ABLATION_LABEL} {ablation:+.2f} ")
        text.rstrip()
        out.append(text)
    return out


def head_lines(head: Head, row: HeadScores | None, null: ScoreNull | None, ablation: float,
               versus: Text | None = None) -> list[Text]:
    """The focused head's candidate lines: ``L1.H2 │`` and its scores, or in compare mode
    (``versus``: A → B of its scores) that instead; a head with non-finite weights says so."""
    layer, h = head
    # Spans start with a visible character (see StatusBar.render): head │ score · score.
    text = Text()
    text.append(f"L{layer}.H{h} ", style="bold")
    if versus is not None:  # compare mode: A → B instead of A's scores alone
        text.append_text(versus)
    choices = [text]
    if versus is None and row is not None:
        text.append("│ ", style="dim")
        choices = [text + scores for scores in score_texts(row, null, ablation)]
    if row is not None and row.nonfinite:
        for choice in choices:
            choice.append(("" if choice.plain.endswith(" ") else " ") + "non-finite weights",
                          style="bold red")
    return choices
