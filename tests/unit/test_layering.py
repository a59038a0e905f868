"""The seams hold: coordinators never load the server layer, and each seam module imports
first in a fresh interpreter (an import cycle shows up exactly then)."""

import subprocess
import sys

import pytest

SEAMS = ["ottla.server.metadata_cache", "ottla.server.partition", "ottla.server.replica_manager",
         "ottla.server.coordinator_runtime", "ottla.server.interbroker", "ottla.coordinator.runtime",
         "ottla.coordinator.group.service", "ottla.coordinator.transaction.service",
         "ottla.cluster.zk", "ottla.cluster.zk_session"]


def _modules_after_import(module: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"import sys, {module}; print('\\n'.join(sys.modules))"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


@pytest.mark.parametrize("module", SEAMS)
def test_imports_first(module):
    assert module in _modules_after_import(module)


@pytest.mark.parametrize("module", ["ottla.coordinator.group.service", "ottla.coordinator.transaction.service"])
def test_coordinators_do_not_import_the_server(module):
    assert not {m for m in _modules_after_import(module) if m.startswith("ottla.server")}
