"""The adapters of this repository's two program pairs, the harness's first two clients.

    cifar_resnet       legacy/cifar_resnet.py       vs modern/cifar_resnet.py
    mnist_multi_gpu    legacy/mnist_multi_gpu.py    vs modern/mnist_multi_gpu.py

A third pair, written in another style, lives under examples/ (examples/cifar10_tutorial/adapter.py).
"""
