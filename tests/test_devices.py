"""Where the towers and replicas go when GPUs exist: `/gpu:i`, several on one GPU when there are
fewer GPUs than towers, and the GPU session settings.

No GPU is needed: TensorFlow's device list is faked (`tf.config.list_physical_devices`), which is
all `legacy/towers.py` and `modern/runtime.configure_devices` consult.
"""
import pytest
import tensorflow as tf

from legacy import cifar_resnet, towers
from modern import runtime


def _fake_gpus(monkeypatch, count):
    real = tf.config.list_physical_devices

    def list_physical_devices(device_type=None):
        if device_type == "GPU":
            return [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(count)]
        return real(device_type)

    # legacy/ reads tf.compat.v1.config, modern/ tf.config: two module objects, one function
    for config in (tf.config, tf.compat.v1.config):
        monkeypatch.setattr(config, "list_physical_devices", list_physical_devices)


@pytest.mark.parametrize("gpus, expected", [(2, ["/gpu:0", "/gpu:1"]), (4, ["/gpu:0", "/gpu:1"]),
                                            (1, ["/gpu:0", "/gpu:0"]), (0, ["/cpu:0", "/cpu:1"])])
def test_legacy_towers_go_to_the_gpus_there_are_and_to_virtual_cpus_without_any(monkeypatch, gpus, expected):
    _fake_gpus(monkeypatch, gpus)
    assert towers.tower_devices(2) == expected


@pytest.mark.parametrize("gpus, num_towers, expected, message", [
    (1, 2, ["/gpu:0", "/gpu:0"], "2 towers on 1 GPU (2 per GPU): /gpu:0, /gpu:0"),
    (2, 3, ["/gpu:0", "/gpu:1", "/gpu:0"], "3 towers on 2 GPUs (1-2 per GPU): /gpu:0, /gpu:1, /gpu:0"),
    (2, 4, ["/gpu:0", "/gpu:1", "/gpu:0", "/gpu:1"],
     "4 towers on 2 GPUs (2 per GPU): /gpu:0, /gpu:1, /gpu:0, /gpu:1")])
def test_legacy_towers_share_fewer_gpus_round_robin_and_the_log_says_so(monkeypatch, gpus, num_towers, expected,
                                                                        message):
    _fake_gpus(monkeypatch, gpus)
    devices = towers.tower_devices(num_towers)
    assert devices == expected
    assert towers.placement_message(devices) == message
    config = cifar_resnet.session_config(num_towers, "auto", devices)
    assert config.allow_soft_placement and config.gpu_options.allow_growth
    assert not config.graph_options.rewrite_options.disable_meta_optimizer  # GPU towers: grappler on


def test_legacy_gpu_towers_keep_the_originals_session_config_and_grappler(monkeypatch):
    _fake_gpus(monkeypatch, 2)
    devices = towers.tower_devices(2)
    assert towers.placement_message(devices) == "towers placed on 2 GPUs: /gpu:0, /gpu:1"
    config = cifar_resnet.session_config(2, "auto", devices)
    assert config.allow_soft_placement and config.gpu_options.allow_growth
    assert not config.graph_options.rewrite_options.disable_meta_optimizer  # grappler on, as the original ran
    cpu_config = cifar_resnet.session_config(2, "auto", ["/cpu:0", "/cpu:1"])
    assert cpu_config.graph_options.rewrite_options.disable_meta_optimizer
    assert dict(cpu_config.device_count) == {"CPU": 2}


def test_modern_replicas_go_to_gpu_i_with_memory_growth_without_touching_the_cpu(monkeypatch):
    _fake_gpus(monkeypatch, 2)

    def must_not_split(*args):
        raise AssertionError("the CPU must not be split into logical devices when GPUs exist")

    monkeypatch.setattr(tf.config, "set_logical_device_configuration", must_not_split)
    growth = []
    monkeypatch.setattr(tf.config.experimental, "set_memory_growth", lambda gpu, on: growth.append((gpu.name, on)))
    assert runtime.configure_devices(2) == ["/gpu:0", "/gpu:1"]
    # The original's gpu_options.allow_growth, on every GPU.
    assert growth == [("/physical_device:GPU:0", True), ("/physical_device:GPU:1", True)]
    assert runtime.placement_message(["/gpu:0", "/gpu:1"]) == "replicas placed on 2 GPUs: /gpu:0, /gpu:1"


def _capture_splits(monkeypatch):
    """Record set_logical_device_configuration's arguments instead of configuring a device."""
    calls = []
    monkeypatch.setattr(tf.config, "set_logical_device_configuration",
                        lambda device, logical: calls.append((device.name, device.device_type, list(logical))))
    return calls


def test_modern_replicas_split_one_gpu_into_logical_gpus_not_the_cpu(monkeypatch):
    _fake_gpus(monkeypatch, 1)
    monkeypatch.delenv(runtime.GPU_MEMORY_VARIABLE, raising=False)
    calls = _capture_splits(monkeypatch)
    devices = runtime.configure_devices(2)
    assert devices == ["/gpu:0", "/gpu:1"]
    logical_gpu = tf.config.LogicalDeviceConfiguration(memory_limit=runtime.DEFAULT_GPU_MEMORY_MB)
    assert calls == [("/physical_device:GPU:0", "GPU", [logical_gpu, logical_gpu])]  # the CPU is not split
    assert runtime.placement_message(devices) == (
        "2 replicas on 1 GPU split into 2 logical GPUs: /gpu:0, /gpu:1 (4096 MB each, $REPLICA_GPU_MEMORY_MB)")
    reduce = runtime.cross_device_ops(devices)  # no NCCL between logical devices of one GPU
    assert isinstance(reduce, tf.distribute.ReductionToOneDevice)


def test_modern_replicas_on_fewer_gpus_get_one_logical_gpu_each_at_the_set_memory(monkeypatch):
    _fake_gpus(monkeypatch, 2)
    monkeypatch.setenv(runtime.GPU_MEMORY_VARIABLE, "1500")
    calls = _capture_splits(monkeypatch)
    assert runtime.configure_devices(3) == ["/gpu:0", "/gpu:1", "/gpu:2"]
    logical_gpu = tf.config.LogicalDeviceConfiguration(memory_limit=1500)
    assert calls == [("/physical_device:GPU:0", "GPU", [logical_gpu] * 2),
                     ("/physical_device:GPU:1", "GPU", [logical_gpu])]
    assert runtime.placement_message(["/gpu:0", "/gpu:1", "/gpu:2"]) == (
        "3 replicas on 2 GPUs split into 3 logical GPUs: /gpu:0, /gpu:1, /gpu:2 "
        "(1500 MB each, $REPLICA_GPU_MEMORY_MB)")


def test_modern_gpu_memory_setting_must_be_a_positive_whole_number(monkeypatch):
    _fake_gpus(monkeypatch, 1)
    monkeypatch.setenv(runtime.GPU_MEMORY_VARIABLE, "4G")
    _capture_splits(monkeypatch)
    with pytest.raises(runtime.DeviceSetupError, match="REPLICA_GPU_MEMORY_MB"):
        runtime.configure_devices(2)


def test_modern_whole_gpus_keep_the_strategys_default_reduction(monkeypatch):
    _fake_gpus(monkeypatch, 2)
    assert runtime.cross_device_ops(["/gpu:0", "/gpu:1"]) is None
