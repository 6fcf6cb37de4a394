"""ResNet-v2-50 in Keras 3, number for number the network tf-slim's `resnet_v2_50` builds.

The network is the full pre-activation ResNet of

    [1] Kaiming He, Xiangyu Zhang, Shaoqing Ren, Jian Sun.
        Identity Mappings in Deep Residual Networks. ECCV 2016, arXiv:1603.05027

as tf-slim implements it (`tf_slim/nets/resnet_v2.py`, `resnet_utils.py`), under slim's
`resnet_arg_scope()`, with the `Logits` head of the legacy CIFAR-10 program
(seed 000_a2968b8fe060e3c0.txt, `legacy/cifar_resnet.py`):

    with slim.arg_scope(resnet_v2.resnet_arg_scope()):
        net, _ = resnet_v2.resnet_v2_50(inputs, num_classes=None, is_training=is_training)
    with tf.variable_scope('Logits'):
        net = tf.squeeze(net, axis=[1, 2])
        net = slim.dropout(net, keep_prob=keep_prob, scope='scope')
        logits = slim.fully_connected(net, num_outputs=10, activation_fn=None, scope='fc')

Typical use::

    from modern.resnet_v2 import resnet_v2_50
    model = resnet_v2_50(num_classes=10, keep_prob=0.6)      # built on a [1, 32, 32, 3] batch
    logits = model(images, training=True)                     # [B, 10]
    features = model.backbone(images, training=False)         # [B, 2048], after the squeeze

Every variable has a TF1 checkpoint name (`modern/checkpoints.py`), so the weights of the legacy
trainer or of slim's published `resnet_v2_50.ckpt` load one-to-one.

Where this differs from `keras.applications.ResNet50V2` (which is *not* this network, see
`tests/test_modern_resnet.py`):
  * pool1: slim max-pools 3x3/2 with 'SAME' padding (windows start at pixel 0, the lone pad is at
    the end and never wins the max); Keras zero-pads one pixel on each side, then pools 'VALID'
    (windows start at pixel -1, and the zero pad does win against negative conv1 outputs).
  * batch norm: slim's `resnet_arg_scope` uses epsilon 1e-5 and decay 0.997; Keras uses 1.001e-5
    and momentum 0.99. (TF 1.x's `fused_batch_norm` raised any epsilon below 1.001e-5 to 1.001e-5
    for cuDNN, hence Keras' value; TF 2.21, on which the legacy program runs, passes 1e-5 through.
    The difference is ~5e-9 relative for unit variances, far below float32 round-off.)
  * moving variance: slim's fused batch norm updates it with the *unbiased* batch variance
    (Bessel's n/(n-1)); Keras 3 uses the biased one. `SlimBatchNorm` below does what slim does.
What is the same: 7x7/2 conv1 with biases and no batch norm; strided 3x3 convs padded
explicitly and symmetrically (`conv2d_same`); stride in the last unit of blocks 1-3.

Regularisation: like `resnet_arg_scope(weight_decay=1e-4)`, every conv kernel (not the biases, not
batch norm, not the `Logits/fc` layer, which the original builds outside the arg scope) carries
slim's `l2_regularizer(1e-4)`, i.e. 1e-4 * sum(w**2) / 2 (tf.nn.l2_loss has the factor 1/2), which
is Keras' `L2(5e-5)`. The losses are exposed in `model.losses`, but the legacy program never adds
`tf.GraphKeys.REGULARIZATION_LOSSES` to its loss, so a faithful trainer must NOT add `model.losses`
either (and must not use `model.fit`, which would).
"""
from __future__ import annotations

import collections
from typing import Any, Callable, Optional, Sequence

import keras
import tensorflow as tf
from keras import ops

# slim.l2_regularizer(scale) adds scale * tf.nn.l2_loss(w) = scale * sum(w**2) / 2.
WEIGHT_DECAY = 1e-4

# slim's variance_scaling_initializer(factor=2.0, mode='FAN_IN', uniform=False) draws a normal
# truncated at 2 sigma with stddev = sqrt(1.3 * factor / fan_in). Keras' truncated_normal divides
# sqrt(scale / fan_in) by 0.87962566103423978 instead, so this scale gives slim's stddev exactly.
SLIM_CONV_INITIALIZER = dict(scale=1.3 * 2.0 * 0.87962566103423978 ** 2, mode="fan_in",
                             distribution="truncated_normal")

# The block table of slim's resnet_v2_50: resnet_v2_block(scope, base_depth, num_units, stride).
# Each unit outputs 4 * base_depth channels through a base_depth-wide bottleneck; the block's
# stride sits in its LAST unit (slim subsamples at the end of a block, the paper at the start).
BlockSpec = collections.namedtuple("BlockSpec", ["scope", "base_depth", "num_units", "stride"])
RESNET_V2_50_BLOCKS: tuple[BlockSpec, ...] = (
    BlockSpec("block1", 64, 3, 2),
    BlockSpec("block2", 128, 4, 2),
    BlockSpec("block3", 256, 6, 2),
    BlockSpec("block4", 512, 3, 1),
)


class SlimBatchNorm(keras.layers.BatchNormalization):
    """Keras batch norm that updates its moving statistics exactly as slim's (fused) batch_norm.

    Normalisation uses the batch mean and the biased batch variance, as both do. The moving
    averages differ in Keras 3: slim's `fused_batch_norm` returns the Bessel-corrected variance,
    and `assign_moving_average` applies it as

        moving_mean     -= (moving_mean - mean) * (1 - decay)
        moving_variance -= (moving_variance - variance * n / max(n - 1, 1)) * (1 - decay)

    with n = batch * height * width elements per channel (n/(n-1) = 4/3 for a batch of 4 at the
    1x1 maps of block4 on 32x32 inputs, so this is not round-off).

    Across replicas (MirroredStrategy): Keras 3 creates the moving statistics with aggregation
    NONE, and then each replica's assign lands only in its own copy; reads and checkpoints see
    replica 0's, which averaged replica 0's rows only, and the copies silently drift apart.  Here
    they are created with aggregation MEAN: every replica proposes its update and all copies get
    the mean of the proposals,
        moving <- moving - (moving - mean_i(a_i)) * (1 - decay)      (a_i: replica i's statistic),
    one update per step from all rows.  The legacy towers instead apply N updates per step to one
    shared variable, in whatever order the TF1 executor runs them; the parity harness
    (`compare/checks/steps.py`) checks both formulas (an EXPECTED difference of order (1 - decay)**2).
    A replica with no rows (a global batch smaller than the replica count) proposes "no change".
    """

    def add_weight(self, *args: Any, **kwargs: Any) -> Any:
        if kwargs.get("name") in ("moving_mean", "moving_variance"):
            kwargs["aggregation"] = "mean"
        return super().add_weight(*args, **kwargs)

    def call(self, inputs: Any, training: Optional[bool] = None) -> Any:
        if not (training and self.trainable):
            return super().call(inputs, training=False)
        # The fused kernel slim runs (FusedBatchNormV3 and its analytic gradient).  Keras 3's own
        # training path differentiates through ops.moments instead: the same function, but at the
        # small per-replica batches of a tower program its gradient carries several times more
        # round-off (compare/run.py sees it in block1's batch-norm parameters when rows are
        # permuted inside a replica).  With the fused kernel the legacy and modern gradients agree
        # to round-off.  It returns the Bessel-corrected batch variance,
        # n / (n - 1) times the one it normalises with, which is what slim's update uses.
        if inputs.dtype == tf.float64:  # no fused kernel for float64 (reference runs): same formulas
            outputs, batch_mean, batch_var = self._moments_batch_norm(inputs)
        else:
            outputs, batch_mean, batch_var = tf.compat.v1.nn.fused_batch_norm(
                inputs, self.gamma, self.beta, epsilon=self.epsilon, is_training=True)
        # An empty batch has NaN moments: propose the current value instead (no change).
        has_rows = tf.shape(inputs)[0] > 0
        batch_mean = tf.where(has_rows, batch_mean, self.moving_mean)
        batch_var = tf.where(has_rows, batch_var, self.moving_variance)
        decay = self.momentum
        self.moving_mean.assign(self.moving_mean - (self.moving_mean - batch_mean) * (1.0 - decay))
        self.moving_variance.assign(
            self.moving_variance - (self.moving_variance - batch_var) * (1.0 - decay))
        return outputs

    def _moments_batch_norm(self, inputs: Any) -> tuple[Any, Any, Any]:
        """(normalised outputs, batch mean, Bessel-corrected batch variance), by ops.moments."""
        rank = len(inputs.shape)
        axes = [a for a in range(rank) if a != self.axis % rank]  # all but the channels'
        mean, variance = ops.moments(inputs, axes=axes)
        n = ops.cast(ops.size(inputs) // ops.shape(inputs)[-1], variance.dtype)
        outputs = ops.batch_normalization(inputs, mean, variance, axis=self.axis, offset=self.beta,
                                          scale=self.gamma, epsilon=self.epsilon)
        return outputs, mean, variance * n / ops.maximum(n - 1.0, 1.0)


def fixed_padding(inputs: Any, kernel_size: int) -> Any:
    """The explicit, symmetric zero padding of slim's `conv2d_same` for a strided conv.

    conv2d_same(stride > 1) == pad [(k-1)//2, (k-1) - (k-1)//2] on height and width, then 'VALID'.
    (A strided 'SAME' conv would pad asymmetrically on even inputs, see resnet_utils.conv2d_same.)
    """
    pad_beg = (kernel_size - 1) // 2
    pad_end = kernel_size - 1 - pad_beg
    return ops.pad(inputs, [[0, 0], [pad_beg, pad_end], [pad_beg, pad_end], [0, 0]])


class BottleneckV2(keras.layers.Layer):
    """slim's `resnet_v2.bottleneck`: the full pre-activation bottleneck unit, Fig. 1(b) of [1].

        preact   = relu(BN(x))                                   'preact'
        shortcut = x, max-pooled 1x1/stride   if depth_in == depth   (slim's `subsample`)
                   conv1x1/stride(preact) + bias, no BN  otherwise   'shortcut'
        residual = relu(BN(conv1x1(preact)))                     'conv1', 'conv1/BatchNorm'
        residual = relu(BN(conv3x3/stride(residual)))            'conv2' (conv2d_same), 'conv2/BatchNorm'
        residual = conv1x1(residual) + bias, no BN               'conv3'
        output   = shortcut + residual

    Convs followed by batch norm have no bias (slim: normalizer_fn set => no biases).
    """

    def __init__(self, depth: int, depth_bottleneck: int, stride: int, depth_in: int,
                 batch_norm: Callable[[str], Any], conv: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stride = stride
        self.preact = batch_norm("preact")
        if depth == depth_in:
            self.shortcut = None
            self.subsample = keras.layers.MaxPooling2D(1, strides=stride) if stride > 1 else None
        else:
            self.shortcut = conv(depth, 1, stride, "shortcut", use_bias=True)
        self.conv1 = conv(depth_bottleneck, 1, 1, "conv1", use_bias=False)
        self.conv1_bn = batch_norm("conv1_BatchNorm")
        self.conv2 = conv(depth_bottleneck, 3, stride, "conv2", use_bias=False)
        self.conv2_bn = batch_norm("conv2_BatchNorm")
        self.conv3 = conv(depth, 1, 1, "conv3", use_bias=True)

    def call(self, inputs: Any, training: bool = False) -> Any:
        preact = ops.relu(self.preact(inputs, training=training))
        if self.shortcut is not None:
            shortcut = self.shortcut(preact)
        elif self.subsample is not None:
            shortcut = self.subsample(inputs)
        else:
            shortcut = inputs
        residual = ops.relu(self.conv1_bn(self.conv1(preact), training=training))
        if self.stride > 1:
            residual = fixed_padding(residual, 3)
        residual = ops.relu(self.conv2_bn(self.conv2(residual), training=training))
        residual = self.conv3(residual)
        return shortcut + residual


class ReplicaDropout(keras.layers.Dropout):
    """Keras' Dropout, with an independent mask on every replica, as every legacy tower has.

    slim.dropout in tower i is its own `random_uniform` op, so the N towers draw N independent
    masks.  Keras 3's Dropout draws `stateless_dropout(x, rate, seed=seed_generator.next())`, and
    under MirroredStrategy the seed generator's state is a mirrored variable: every replica reads
    the same seed, so replicas with the same row count drop the SAME units (identical masks on
    2 replicas; the parity harness, `compare/checks/forward.py`, checks the masks differ).
    Here the replica's id is folded into the seed:  seed_i = stateless_fold_in(seed, replica_id).  Per row the mask is
    still keep with probability 1 - rate, scaled by 1 / (1 - rate), as slim's.
    """

    def call(self, inputs: Any, training: bool = False) -> Any:
        if not training or self.rate == 0:
            return inputs
        seed = tf.cast(tf.math.floormod(self.seed_generator.next(), tf.int32.max - 1), tf.int32)
        context = tf.distribute.get_replica_context()
        replica = context.replica_id_in_sync_group if context is not None else 0
        seed = tf.random.experimental.stateless_fold_in(seed, replica)
        return tf.nn.experimental.stateless_dropout(inputs, rate=self.rate, seed=seed)


class ResNetV2_50(keras.Model):
    """slim's `resnet_v2_50(num_classes=None)` plus the legacy `Logits` head (squeeze, dropout, fc).

    Args:
      num_classes: outputs of `Logits/fc`.
      keep_prob: the legacy dropout keep probability; the Dropout rate is 1 - keep_prob.
      bn_epsilon, bn_momentum: batch norm epsilon and decay (resnet_arg_scope: 1e-5, 0.997).
      weight_decay: slim's l2_regularizer scale for conv kernels (see module docstring).
      blocks: the block table, `RESNET_V2_50_BLOCKS`.

    Attributes the harness and the checkpoint converter use: `conv1`, `blocks` (a tuple of tuples of
    `BottleneckV2`, with `block_specs`), `postnorm`, `dropout`, `fc`, `scope` ('resnet_v2_50').
    """

    scope = "resnet_v2_50"

    def __init__(self, num_classes: int = 10, keep_prob: float = 0.6, bn_epsilon: float = 1e-5,
                 bn_momentum: float = 0.997, weight_decay: float = WEIGHT_DECAY,
                 blocks: Sequence[Any] = RESNET_V2_50_BLOCKS, name: str = "resnet_v2_50",
                 **kwargs: Any) -> None:
        super().__init__(name=name, **kwargs)
        self.num_classes = num_classes
        self.keep_prob = keep_prob
        self.block_specs = tuple(blocks)

        def batch_norm(name: str) -> SlimBatchNorm:
            return SlimBatchNorm(momentum=bn_momentum, epsilon=bn_epsilon, center=True, scale=True,
                                 name=name)

        def conv(filters: int, kernel_size: int, stride: int, name: str, use_bias: bool) -> Any:
            # 'SAME' for stride 1; strided 3x3/7x7 convs get fixed_padding first, then 'VALID'
            # (a strided 1x1 conv needs no padding: 'SAME' and 'VALID' agree).
            padding = "same" if stride == 1 or kernel_size == 1 else "valid"
            return keras.layers.Conv2D(
                filters, kernel_size, strides=stride, padding=padding, use_bias=use_bias,
                kernel_initializer=keras.initializers.VarianceScaling(**SLIM_CONV_INITIALIZER),
                kernel_regularizer=keras.regularizers.L2(weight_decay / 2.0), name=name)

        # Root block: conv1 has biases and neither batch norm nor activation, because the first
        # unit's preact does both (Appendix of [1]); then slim's 'SAME' 3x3/2 max-pool.
        self.conv1 = conv(64, 7, 2, "conv1", use_bias=True)
        self.pool1 = keras.layers.MaxPooling2D(3, strides=2, padding="same", name="pool1")
        blocks, depth_in = [], 64
        for spec in self.block_specs:
            units = []
            for i in range(spec.num_units):
                stride = spec.stride if i == spec.num_units - 1 else 1
                units.append(BottleneckV2(4 * spec.base_depth, spec.base_depth, stride, depth_in,
                                          batch_norm, conv, name=f"{spec.scope}_unit_{i + 1}"))
                depth_in = 4 * spec.base_depth
            blocks.append(tuple(units))
        # Tuples, not lists: on the TF backend, Keras 3 (3.15) wraps list attributes in its own
        # list type, which tf.train.Checkpoint does not follow, so the units' weights would be
        # silently left out of every checkpoint (keras-team/keras#18398). Tuples are tracked.
        self.blocks = tuple(blocks)
        # The pre-activation units leave their sum un-normalised, so slim adds a final BN + relu.
        self.postnorm = batch_norm("postnorm")
        # The Logits head, built outside resnet_arg_scope in the original: Xavier-uniform weights
        # (Keras' glorot_uniform), zero biases, no regulariser.
        self.dropout = ReplicaDropout(1.0 - keep_prob, name="Logits_scope")
        self.fc = keras.layers.Dense(num_classes, name="Logits_fc")

    def backbone(self, images: Any, training: bool = False) -> Any:
        """Images [B, H, W, 3] -> pooled features [B, 2048] (slim's net, squeezed)."""
        net = self.conv1(fixed_padding(images, 7))
        net = self.pool1(net)
        for units in self.blocks:
            for unit in units:
                net = unit(net, training=training)
        net = ops.relu(self.postnorm(net, training=training))
        net = ops.mean(net, axis=[1, 2], keepdims=True)  # 'pool5'
        return ops.squeeze(net, axis=[1, 2])

    def call(self, images: Any, training: bool = False) -> Any:
        """Images -> logits [B, num_classes]; dropout is active only when training."""
        net = self.dropout(self.backbone(images, training=training), training=training)
        return self.fc(net)


def resnet_v2_50(num_classes: int = 10, keep_prob: float = 0.6, **kwargs: Any) -> ResNetV2_50:
    """A built `ResNetV2_50` (variables created on a [1, 32, 32, 3] batch of zeros)."""
    model = ResNetV2_50(num_classes=num_classes, keep_prob=keep_prob, **kwargs)
    model(ops.zeros([1, 32, 32, 3]), training=False)
    return model
