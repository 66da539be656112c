"""The allocator policy of the console script (engine/core/memory.py), in fresh processes:
a large block freed and allocated again reuses the pages under ``keep_freed_memory`` and
faults them in anew under glibc's defaults."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")

# 64 MB: over glibc's largest mmap threshold (32 MB), so by default each block is mapped on its
# own and unmapped when freed; filled with ones so every page is touched
PROBE = """
import contextlib, json, resource, sys
import numpy as np
from headscope.engine.core.memory import keep_freed_memory, release_free_heap, returned_when_freed

applied = keep_freed_memory()
within = returned_when_freed() if sys.argv[1:] == ["returned"] else contextlib.nullcontext()

def faults():
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

def fill():
    before = faults()
    block = np.ones(16 << 20, np.float32)
    return faults() - before, block

with within:
    first, block = fill()
    del block
    again, block = fill()
    del block
after, block = fill()  # outside returned_when_freed: kept again
del block
last, block = fill()
release_free_heap()
print(json.dumps({"applied": applied, "first": first, "again": again, "after": after, "last": last}))
"""


def probe(keep: str, *args: str) -> dict:
    env = {**os.environ, "HEADSCOPE_KEEP_FREED_MEMORY": keep}
    done = subprocess.run([sys.executable, "-c", PROBE, *args], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_freed_block_is_reused_without_new_page_faults():
    kept = probe("1")
    assert kept["applied"] is True
    assert kept["first"] > 0  # the first block's pages are new (a page fault each, or per huge page)
    assert kept["again"] <= kept["first"] // 4  # the second block is the first one's pages


def test_glibc_defaults_fault_the_pages_in_again():
    default = probe("0")
    assert default["applied"] is False
    assert default["again"] >= default["first"] // 2  # unmapped when freed: new pages again


def test_within_returned_when_freed_blocks_go_back_and_are_kept_after():
    """The middles' vocabulary-sized temporaries are unmapped when freed (not left as holes in
    the heap); after the block, freed blocks are kept again."""
    kept = probe("1", "returned")
    assert kept["applied"] is True
    assert kept["again"] >= kept["first"] // 2  # unmapped when freed, within
    assert kept["last"] <= kept["after"] // 4  # kept again after it
