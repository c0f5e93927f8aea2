"""pytest plugin for probes: ``DDT_EXTRA_DEFINES="NAME=1 OTHER=2"`` adds NVRTC defines to every
ddtree.cu compile of the run (as tests/test_ddtree_gpu.py's search_defines does for one test).
Use: ``PYTHONPATH=$PWD:research/probes pytest -p ddt_defines ...``."""
import os


def pytest_configure(config):
    extra = dict(kv.split("=", 1) for kv in os.environ.get("DDT_EXTRA_DEFINES", "").split())
    if not extra:
        return
    from driverlevel import ddtree

    plain = ddtree.compile_defines
    ddtree.compile_defines = lambda arch, topk="threshold": {**plain(arch, topk), **{k: int(v) for k, v in extra.items()}}
