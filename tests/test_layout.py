"""The tests mirror the packages (issue 36): ``tests/engine/<layer>/test_<module>.py`` and
``tests/tui/<layer>/test_<module>.py``. A test file in a mirrored folder is named after a module
(or a package) of the folder it mirrors (``test_<module>.py``, or ``test_<module>_<aspect>.py``),
never after a module that does not exist; at least 70 % of the modules of engine/ and tui/
have a test file named after them. Journeys (CLI, explorer, serve, README) are in tests/e2e/,
checks across a package's layers in tests/engine/ or tests/tui/ themselves."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "tui")
NAMED_SHARE = 0.70


def modules() -> list[Path]:
    return sorted(p.relative_to(ROOT) for top in PACKAGES for p in (ROOT / top).rglob("*.py")
                  if p.name != "__init__.py")


def test_every_mirrored_test_file_names_a_module_of_its_folder() -> None:
    strays = []
    for test in sorted((ROOT / "tests").rglob("test_*.py")):
        rel = test.relative_to(ROOT / "tests")
        if rel.parts[0] not in PACKAGES or len(rel.parts) == 2:
            continue  # not in a layer folder: a check across the package's layers
        folder = ROOT / Path(*rel.parts[:-1])
        names = ({p.stem for p in folder.glob("*.py")} | {p.name for p in folder.iterdir() if p.is_dir()}
                 if folder.is_dir() else set())  # a module, or a package (adapters/) as a whole
        stem = test.stem.removeprefix("test_")
        if stem not in names and not any(stem.startswith(f"{n}_") for n in names):
            strays.append(str(rel))
    assert not strays, f"named after no module of the folder they mirror: {strays}"


def test_most_modules_have_a_test_file_named_after_them() -> None:
    found = modules()
    missing = [str(m) for m in found
               if not (ROOT / "tests" / m.parent / f"test_{m.stem}.py").exists()]
    named = len(found) - len(missing)
    assert named >= NAMED_SHARE * len(found), (
        f"{named} of {len(found)} modules have a test file named after them; without one: {missing}")


# The project's own checks (layers, lint, packaging, lazy imports, this layout); every other
# test lives in a mirrored folder, tests/e2e/, tests/bench/ or tests/sample_models/.
PROJECT_CHECKS = {"test_engine_imports.py", "test_layers.py", "test_layout.py", "test_lint.py",
                  "test_packaging.py"}


def test_no_test_file_is_left_at_the_top_of_tests() -> None:
    loose = sorted(p.name for p in (ROOT / "tests").glob("test_*.py"))
    assert set(loose) <= PROJECT_CHECKS, (
        f"move {sorted(set(loose) - PROJECT_CHECKS)} to tests/engine/<layer>/, tests/tui/<layer>/ "
        "(test_<module>.py) or tests/e2e/ (a journey)")
