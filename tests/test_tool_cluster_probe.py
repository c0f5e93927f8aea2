"""tools/cluster_probe.py without a GPU: its argument ranges, the cluster launch configuration it
hands cuOccupancyMaxActiveClusters (grid a multiple of the cluster, the cluster-dimension
attribute), and a clear message where no GPU is usable."""

import importlib.util
from pathlib import Path

import pytest
from cuda.bindings import driver

_spec = importlib.util.spec_from_file_location("cluster_probe", Path(__file__).parents[1] / "tools" / "cluster_probe.py")
probe = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(probe)


def test_argument_ranges():
    a = probe.parse_args([])
    assert (a.depth, a.budget, a.sizes) == (15, [16, 256], [2, 4, 8, 12, 15, 16])
    for bad in (["--depth", "0"], ["--depth", "33"], ["--budget", "0"], ["--budget", "16", "513"], ["--sizes", "0"]):
        with pytest.raises(SystemExit):
            probe.parse_args(bad)


def test_cluster_config():
    cfg = probe.cluster_config(driver, 15, 512, 40_000)
    assert (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ) == (225, 1, 1)
    assert (cfg.blockDimX, cfg.sharedMemBytes, cfg.numAttrs) == (512, 40_000, 1)
    a = cfg.attrs[0]
    assert a.id == driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    assert (a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z) == (15, 1, 1)


def test_no_gpu_is_a_clear_exit(capsys):
    from driverlevel._device import NO_GPU_EXIT_STATUS, NO_GPU_MESSAGE, gpu_usable

    if gpu_usable():
        pytest.skip("a GPU is usable here")
    with pytest.raises(SystemExit) as e:
        probe.main([])
    assert e.value.code == NO_GPU_EXIT_STATUS
    assert NO_GPU_MESSAGE in capsys.readouterr().err
