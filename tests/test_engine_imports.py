"""engine/ is UI-free (docs/internals.md, "Module map"): no tui, textual or plotext, statically or at import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = ("tui", "textual", "textual_plotext", "plotext")


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in (
            "import_module",
            "__import__",
        ):
            arg = node.args[0] if node.args else None
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.append((node.lineno, arg.value))
    return found


def test_engine_sources_never_import_ui_modules():
    files = sorted((ROOT / "engine").rglob("*.py"))
    assert files, "engine/ has no sources?"
    offences = []
    for path in files:
        tree = ast.parse(path.read_text(), filename=str(path))
        for line, module in _imported_modules(tree):
            if module.removeprefix("headscope.").split(".")[0] in FORBIDDEN:
                offences.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not offences, "\n".join(offences)


def test_importing_every_engine_module_loads_no_ui_and_engine_loads_no_torch():
    modules = sorted(
        "headscope." + ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for p in (ROOT / "engine").rglob("*.py")
    )
    code = f"""
import importlib, sys
import headscope.engine, headscope.engine.service.engine, headscope.engine.core.results, headscope.engine.core.cache, headscope.engine.service.scheduler
import headscope.engine.api.model, headscope.engine.forward.runtime
assert "torch" not in sys.modules, "importing engine / engine.service / the facade imports torch"
from headscope.engine import Model, open_model, read_structure
from headscope.sample_models import bundled_model
assert read_structure(bundled_model())["n_layers"] > 0
assert "torch" not in sys.modules, "read_structure imports torch"
for name in {modules!r}:
    importlib.import_module(name)
bad = sorted(m for m in sys.modules if m.split(".")[0] in {FORBIDDEN!r} or m.startswith("headscope.tui"))
assert not bad, bad
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


def test_the_cli_info_command_never_imports_torch():
    """``headscope info`` answers from the header and config (``api.model.read_structure``),
    importing no other command's module, no Rich (JSON and TSV need none) and no package
    metadata (``--version`` only): issue 40, ``info`` < 0.5 s."""
    code = """
import sys
from headscope.sample_models import bundled_model
from headscope.tui.cli.main import main
assert main(["info", str(bundled_model()), "--json"]) == 0
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("headscope"))
commands = sorted(m for m in sys.modules if m.startswith("headscope.tui.cli.commands."))
assert commands == ["headscope.tui.cli.commands.info"], commands
assert "rich" not in sys.modules and "importlib.metadata" not in sys.modules
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "n_layers" in done.stdout or "layers" in done.stdout
