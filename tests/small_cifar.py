"""The CIFAR pair at one unit per block, for the tests: both programs built with their own
`--units_per_block 1 1 1 1` (slim's `resnet_v2` builder and the port's `ResNetV2_50`, ResNet-v2-50's
blocks, depths, strides, scopes and names, one unit each), judged by the seed pair's own adapter.

    python compare/run.py --pair small_cifar --quick     # with tests/ on PYTHONPATH

`compare/run.py --model cifar` judges the programs at ResNet-v2-50's 3 4 6 3 units.
"""
from compare.pairs import cifar_resnet
from compare.programs import Programs

UNITS = (1, 1, 1, 1)
PAIR = cifar_resnet.make_pair(Programs.load(), units_per_block=UNITS)
