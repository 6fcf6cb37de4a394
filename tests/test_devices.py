"""Where the towers and replicas go when GPUs exist: `/gpu:i` and the GPU session settings.

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
                                            (1, ["/cpu:0", "/cpu:1"]), (0, ["/cpu:0", "/cpu:1"])])
def test_legacy_towers_go_to_gpu_i_only_when_there_are_enough_gpus(monkeypatch, gpus, expected):
    _fake_gpus(monkeypatch, gpus)
    assert towers.tower_devices(2) == expected


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


def test_modern_replicas_go_to_gpu_i_without_touching_the_cpu(monkeypatch):
    _fake_gpus(monkeypatch, 2)

    def must_not_split(*args):
        raise AssertionError("the CPU must not be split into logical devices when GPUs exist")

    monkeypatch.setattr(tf.config, "set_logical_device_configuration", must_not_split)
    assert runtime.configure_devices(2) == ["/gpu:0", "/gpu:1"]
    assert runtime.placement_message(["/gpu:0", "/gpu:1"]) == "replicas placed on 2 GPUs: /gpu:0, /gpu:1"
