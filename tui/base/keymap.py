"""Every key of the app, with an id (for user keymaps) and a tooltip (for the help screen).

Users remap keys by id, posting-style, in the ``[keymap]`` table of the settings file
(``tui.base.settings``: ``~/.config/headscope/config.toml``)::

    [keymap]
    next-head = "n"
    prev-head = "N"
    quit = "ctrl+q"
"""

from __future__ import annotations

import dataclasses

from textual.binding import Binding

# Bindings stay on the app (one list, one footer order, remappable by id); the explorer's own
# actions are addressed as ``screen.…``: the explorer screen (tui/screens/explorer.py) runs them.

APP_BINDINGS: list[Binding] = [
    Binding("q,ctrl+q", "quit", "Quit", id="quit", priority=False,
            tooltip="Quit headscope"),
    Binding("question_mark", "help", "Help", id="help", key_display="?",
            tooltip="Show every key and what it does"),
    Binding("left_square_bracket", "screen.step_head(-1)", "Prev head", id="prev-head",
            key_display="[", tooltip="Focus the previous head (across layers)"),
    Binding("right_square_bracket", "screen.step_head(1)", "Next head", id="next-head",
            key_display="]", tooltip="Focus the next head (across layers)"),
    Binding("v", "screen.toggle_directions", "Directions", id="toggle-directions",
            tooltip="QK/OV tabs: show or hide the panel of the head's singular directions as "
                    "tokens beside the heatmap (hidden at first below 100 columns, where it "
                    "takes the place of OV's top outputs, and in compare mode); from another "
                    "tab, the OV tab with the panel"),
    Binding("left_parenthesis", "screen.step_direction(-1)", "Prev direction",
            id="prev-direction", show=False, key_display="(",
            tooltip="Directions panel: the previous singular direction"),
    Binding("right_parenthesis", "screen.step_direction(1)", "Next direction",
            id="next-direction", show=False, key_display=")",
            tooltip="Directions panel: the next singular direction (σ, the tokens it reads "
                    "and writes, their overlap)"),
    Binding("1", "screen.show_tab('qk')", "QK", id="tab-qk", show=False,
            tooltip="QK tab: token and positional QK circuits"),
    Binding("2", "screen.show_tab('ov')", "OV", id="tab-ov", show=False,
            tooltip="OV tab: full OV circuit and top promoted tokens"),
    Binding("3", "screen.show_tab('spectrum')", "Spectrum", id="tab-spectrum", show=False,
            tooltip="Spectrum tab: eigenvalues of the OV and QK circuits"),
    Binding("4", "screen.show_tab('prompt')", "Prompt", id="tab-prompt", show=False,
            tooltip="Prompt tab: attention pattern, direct logit attribution, predictions"),
    Binding("5", "screen.show_tab('composition')", "Composition", id="tab-composition", show=False,
            tooltip="Composition tab: Q/K/V composition graph and top edges"),
    Binding("6", "screen.show_tab('summary')", "Summary", id="tab-summary", show=False,
            tooltip="Summary table: every head with every score"),
    Binding("slash", "screen.choose_tokens", "Tokens", id="choose-tokens", key_display="/",
            tooltip="Choose the tokens (rows/columns) of the QK and OV heatmaps"),
    Binding("p", "screen.edit_prompt", "Prompt", id="edit-prompt",
            tooltip="Edit the prompt run through the model"),
    Binding("z", "screen.zoom", "Zoom", id="zoom",
            tooltip="QK, OV, Spectrum, Prompt tabs: the tab's main chart on the whole screen, "
                    "pooled less (at 80×24 the Prompt pattern's induction stripe shows); z or "
                    "esc: back"),
    Binding("c", "screen.composition", "Comp", id="composition",
            tooltip="Show composition; pressed again, switch Q → K → V"),
    Binding("r", "screen.toggle_raw", "Raw/proc", id="toggle-raw",
            tooltip="Toggle raw and processed (folded, centred) weights"),
    Binding("t", "cycle_theme", "Theme", id="cycle-theme",
            tooltip="Cycle the themes (dark, light, high contrast, colour-blind safe)"),
    Binding("m", "cycle_colormap", "Colours", id="cycle-colormap", show=False,
            tooltip="Cycle the heatmap colour map (incl. colour-blind safe blue/orange)"),
    Binding("comma", "screen.step_source(-1)", "Prev source", id="prev-source", show=False,
            key_display=",", tooltip="OV: previous source token for the top outputs"),
    Binding("full_stop", "screen.step_source(1)", "Next source", id="next-source", show=False,
            key_display=".", tooltip="OV: next source token for the top outputs"),
    Binding("minus", "screen.step_offset(-1)", "Offset −", id="offset-down", show=False,
            key_display="-", tooltip="Rotary QK: smaller offset Δ"),
    Binding("equals_sign,plus", "screen.step_offset(1)", "Offset +", id="offset-up", show=False,
            key_display="+", tooltip="Rotary QK: larger offset Δ"),
    Binding("o", "screen.cycle_sort", "Sort", id="cycle-sort", show=False,
            tooltip="Summary/edges: sort by the next score column"),
    Binding("a", "screen.ablation_sweep", "Ablate", id="ablation-sweep", show=False,
            tooltip="Zero-ablate every head in turn: the loss it costs on repeated random "
                    "tokens (Summary column zero-abl, focus line)"),
    Binding("s", "screenshot_svg", "SVG", id="screenshot",
            tooltip="Save an SVG screenshot to the output directory"),
    Binding("e", "screen.export", "Export", id="export",
            tooltip="Export the current view's data as JSON to the output directory"),
    Binding("f", "screen.cycle_filter", "Filter", id="cycle-filter", show=False,
            tooltip="Head tree: show only heads with induction / prev-token / copying / sink "
                    "(first token or delimiters) ≥ 0.3, each with its z against random heads; "
                    "then every head again"),
    Binding("less_than_sign", "screen.step_threshold(-1)", "Threshold −", id="threshold-down",
            show=False, key_display="<",
            tooltip="Composition graph: lower the edge threshold (more edges)"),
    Binding("greater_than_sign", "screen.step_threshold(1)", "Threshold +", id="threshold-up",
            show=False, key_display=">",
            tooltip="Composition graph: raise the edge threshold (fewer, stronger edges)"),
    Binding("7", "screen.show_tab('changes')", "Changes", id="tab-changes", show=False,
            tooltip="Compare mode: biggest changes A → B and the composition-graph diff"),
    Binding("d", "screen.toggle_compare_view", "A|B / B−A", id="compare-view", show=False,
            tooltip="Compare mode: QK/OV heatmaps of A and B side by side, or A and B − A"),
    Binding("8", "screen.show_tab('timeline')", "Timeline", id="tab-timeline", show=False,
            tooltip="Timeline mode: every head's scores across the steps, the phase changes"),
    Binding("9", "screen.show_tab('patch')", "Patch", id="tab-patch", show=False,
            tooltip="Patch tab: activation or attribution patching of every head (the induction "
                    "or first-occurrence task, or your prompts): what each head recovers, "
                    "sorted; enter focuses it"),
    Binding("0", "screen.show_tab('circuit')", "Circuit", id="tab-circuit", show=False,
            tooltip="Circuit tab: the circuit edge attribution finds (EAP-IG; m: EAP) for the Patch "
                    "tab's prompts or the first-occurrence task: graph, edges with exact checks, "
                    "faithfulness; +/- N; enter: the edge's heads"),
    Binding("x", "screen.stop_patch", "Stop patching", id="stop-patch", show=False,
            tooltip="Patch tab: stop the patching run"),
    Binding("left_curly_bracket", "timeline_step(-1)", "Prev step", id="prev-step",
            show=False, key_display="{",
            tooltip="Timeline mode: the previous step (every tab then shows its weights)"),
    Binding("right_curly_bracket", "timeline_step(1)", "Next step", id="next-step",
            show=False, key_display="}",
            tooltip="Timeline mode: the next step (every tab then shows its weights)"),
    # -- the "why" view of the Prompt tab's pattern (QK attribution, issue 38) --
    Binding("w", "screen.why", "Why", id="why", show=False,
            tooltip="Prompt tab: why the head attends at the pattern's cursor cell: its score "
                    "split into query-side × key-side sources (earlier heads, MLPs, embeddings), "
                    "in the pattern's place; ← → move along the row; pressed again, the pattern"),
    Binding("W", "screen.explain_head", "Explain head", id="explain-head", show=False,
            tooltip="Prompt tab: the cursor to the pattern's strongest off-diagonal cell "
                    "(against uniform attention; the first token left out), and why there"),
    Binding("shift+up", "screen.why_cursor(-1, 0)", "Cell ↑", id="why-cursor-up", show=False,
            tooltip="Prompt tab: the pattern's cursor one query up (the why view follows)"),
    Binding("shift+down", "screen.why_cursor(1, 0)", "Cell ↓", id="why-cursor-down", show=False,
            tooltip="Prompt tab: the pattern's cursor one query down (the why view follows)"),
    Binding("shift+left", "screen.why_cursor(0, -1)", "Cell ←", id="why-cursor-left", show=False,
            tooltip="Prompt tab: the pattern's cursor one key left"),
    Binding("shift+right", "screen.why_cursor(0, 1)", "Cell →", id="why-cursor-right", show=False,
            tooltip="Prompt tab: the pattern's cursor one key right (at most the query's own)"),
]

# Keys handled by widgets, listed in the help screen (the tree's own bindings are on HeadTree).
WIDGET_KEYS: list[tuple[str, str]] = [
    ("↑ ↓ / j k", "move in the head tree, tables and lists"),
    ("← → / h l", "collapse / expand a layer in the tree"),
    ("enter", "tree, summary, patch list: focus the head under the cursor; composition "
              "edge: open its virtual heads (K-path heatmap and score, V-path copying and "
              "spectrum; g there focuses the later head); a patch box: run patching"),
    ("- + / < >", "Circuit tab: fewer / more edges in the circuit (1, 2, 5, 10, …; < > by one); "
                  "m: EAP-IG or EAP; enter on an edge: its head's QK (OV for a value input) "
                  "and the two heads' composition score"),
    ("letters", "Patch tab: typed into its form (the box last typed in, the clean prompt "
                "at first), not run as keys; the tab keys, x, [ ], ?, e, s still act"),
    ("tab / shift+tab", "move focus between panes"),
    ("ctrl+p", "command palette: go to head L.H, sort, themes, exports"),
    ("escape", "close a dialog; leave the prompt box or a pane for the head tree"),
]


def modal_binding(binding_id: str) -> Binding:
    """The app's binding ``binding_id`` for a modal screen: Textual stops a modal screen's
    key chain before the app's bindings (``Screen._modal_binding_chain``), so an app key such
    as ``s`` did nothing there. Same keys, id (a user keymap remaps both) and tooltip, the
    action addressed to the app."""
    (binding,) = [b for b in APP_BINDINGS if b.id == binding_id]
    return dataclasses.replace(binding, action=f"app.{binding.action}")
