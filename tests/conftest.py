"""Fixtures shared by test modules."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _tool(name: str) -> str:
    local = Path(sys.executable).parent / name  # the test extra installs cmake and ninja here
    found = str(local) if local.exists() else shutil.which(name)
    if not found:
        pytest.fail(f"{name} not found: install the test extra (pip install '.[test]')")
    return found


@pytest.fixture(scope="session")
def cpp_build(tmp_path_factory) -> Path:
    """The static core with the C++ examples and tests (tests/cpp: decode_no_alloc, the Metal
    emulator), built once per session."""
    build = tmp_path_factory.mktemp("cpp-build")
    cmake = _tool("cmake")
    env = dict(os.environ, PATH=f"{Path(_tool('ninja')).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    subprocess.run([cmake, "-S", str(ROOT), "-B", str(build), "-G", "Ninja", "-DEDGERUNNER_EXAMPLES=ON",
                    "-DEDGERUNNER_TESTS=ON", "-DEDGERUNNER_METAL=OFF"], check=True, capture_output=True, env=env)
    r = subprocess.run([cmake, "--build", str(build)], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    return build
